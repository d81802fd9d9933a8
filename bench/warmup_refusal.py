"""How long `warmup` takes to refuse bad input, this checkout's code against a baseline's, runs alternating (#60).

    git archive main core client warmup | tar -x -C /tmp/baseline
    python bench/warmup_refusal.py --baseline /tmp/baseline

The baseline is another tree's ``core``, ``client`` and ``warmup`` folders, put first on PYTHONPATH (they are the
source roots of the ``jaxcache`` namespace); this checkout's run as installed. Each case is a whole ``python -m
jaxcache.warmup`` process, exit 2 expected. Prints one JSON line: per case, each arm's wall seconds, their medians and
baseline / this (> 1: this checkout refuses faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

EXAMPLE = "jaxcache.warmup.examples:warm"


def cases(cache: str, open_dir: str) -> dict[str, list[str]]:
    return {
        "bad topology": ["--topology", "1x2", "--cache-dir", cache, "--entrypoint", EXAMPLE],
        "bad option value": ["--topology", "1x1x2", "--cache-dir", cache, "--entrypoint", EXAMPLE,
                             "--verify-timeout", "abc"],
        "bad entrypoint": ["--topology", "1x1x2", "--cache-dir", cache, "--entrypoint", "nocolon"],
        "untrusted cache directory": ["--topology", "1x1x2", "--platform", "cpu", "--cache-dir", open_dir,
                                      "--entrypoint", EXAMPLE],
    }


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "jaxcache.warmup", *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    took = time.perf_counter() - started
    if proc.returncode != 2:
        raise SystemExit(f"{argv}: exit {proc.returncode}, not 2: {proc.stderr[-500:]}")
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="a tree with the baseline's core, client and warmup folders")
    p.add_argument("--runs", type=int, default=5, help="runs of each arm a case, alternating")
    args = p.parse_args()
    this = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base = {**this, "PYTHONPATH": os.pathsep.join(os.path.join(args.baseline, part)
                                                   for part in ("core", "client", "warmup"))}
    out: dict[str, object] = {"runs": args.runs, "load_average": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="jaxcache-bench-refusal-") as tmp:
        open_dir = os.path.join(tmp, "open")
        os.mkdir(open_dir)
        os.chmod(open_dir, 0o777)  # others can write it: refused by the trust check
        for name, argv in cases(os.path.join(tmp, "never-written"), open_dir).items():
            walls: dict[str, list[float]] = {"baseline": [], "this": []}
            for _ in range(args.runs):
                walls["baseline"].append(round(timed(argv, base), 3))
                walls["this"].append(round(timed(argv, this), 3))
            medians = {arm: statistics.median(w) for arm, w in walls.items()}
            out[name] = {"wall_s": walls, "median_s": medians,
                         "baseline_over_this": round(medians["baseline"] / medians["this"], 2)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
