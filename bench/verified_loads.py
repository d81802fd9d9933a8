"""What ``verify="signed"`` costs a warm start: the time to a small transformer's first train step from a warm
local cache whose entries a key signed as they were written, with every load checked against that key's signature
(the ``-sig`` object read beside the entry, the bytes hashed, the Ed25519 signature verified) against the same
start without verification, and an A/A arm of the latter to show the noise. Fresh processes in a rotating order,
medians, ratios within one run (bench/coldstart_worker.py trains; a warm run that misses anything exits 4)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
from coldstart import _shape_args, entries, launch  # noqa: E402

_ARMS = ("warm", "warm-signed", "warm-again")
_TARGET = 1.05  # #34: a warm first step with verification at most 1.05x one without


def measure(args: argparse.Namespace, work: str) -> dict[str, list[dict]]:
    shape = _shape_args(args)
    cache = os.path.join(work, "cache")
    from jaxcache import signing

    key_file = os.path.join(work, "bench.key")
    public = signing.new_key("bench", key_file).public_text()
    launch(["--mode", "cold", "--cache-dir", cache, "--steps", "1", *shape], env={"JAXCACHE_SIGNING_KEY": key_file})
    written = entries(cache)
    runs: dict[str, list[dict]] = {arm: [] for arm in _ARMS}
    for r in range(args.repeat):
        for arm in _ARMS[r % 3:] + _ARMS[: r % 3]:
            env = {"JAXCACHE_VERIFY": "signed", "JAXCACHE_TRUSTED_KEYS": public} if arm == "warm-signed" else {}
            got = launch(["--mode", "warm", "--cache-dir", cache, "--steps", "1", *shape], env=env)
            if entries(cache) != written:
                raise SystemExit(f"the {arm!r} run wrote to the warm cache: it missed")
            runs[arm].append(got)
            print(f"  run {r + 1}/{args.repeat} {arm:12s} first step {got['first_step_s']:6.2f} s "
                  f"({got['stats']['hits']} loads)", file=sys.stderr)
    return runs


def report(runs: dict[str, list[dict]]) -> dict:
    first = {arm: statistics.median(r["first_step_s"] for r in rs) for arm, rs in runs.items()}
    return {"first_step_s_median": first,
            "entry_loads_per_start": sorted({r["stats"]["hits"] for r in runs["warm-signed"]}),
            "ratio_signed": first["warm-signed"] / first["warm"], "ratio_a_a": first["warm-again"] / first["warm"],
            "target": _TARGET, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/verified_loads.py", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="rounds of the three arms (default 9)")
    for name, default in (("layers", 4), ("d-model", 64), ("heads", 4), ("seq", 32), ("batch", 4), ("vocab", 256)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--out", default=os.path.join(_HERE, "out", "verified_loads.json"))
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="jaxcache-bench-verified-")
    try:
        fig = report(measure(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(fig, f, indent=1)
    med = fig["first_step_s_median"]
    print(f"warm first step, median of {args.repeat}: {med['warm']:.3f} s without verification, "
          f"{med['warm-signed']:.3f} s with verify='signed' ({fig['entry_loads_per_start']} loads checked), "
          f"{med['warm-again']:.3f} s without again")
    print(f"ratio signed/without {fig['ratio_signed']:.3f} (target <= {_TARGET}); A/A {fig['ratio_a_a']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
