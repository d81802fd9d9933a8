"""One `warmup` command for several targets, one target at a time (``--parallel 1``) against N at a time: wall time
of the whole command, and each target's process's wall time and peak memory. Every run fills an empty cache.

    .venv-tpu/bin/python bench/warmup_targets.py                      # the example, 4 TPU targets, 1 against 2
    .venv-tpu/bin/python bench/warmup_targets.py --entrypoint bench.tpu_model:warm --targets 2xv5e:4x8 \\
        --parallel 1 --rounds 1                                       # the 6-layer decoder for two v5e:4x8 slices

Run from the checkout's root with an interpreter that has libtpu (``make .venv-tpu/.stamp``). Prints one JSON line:
per arm, each round's command wall time and CPU seconds (the command's and its targets' processes'), every target's
wall time, peak RSS and JAX's compile seconds, their medians, and the serial arm's median wall over each other arm's
(> 1: running targets side by side is faster).
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
from typing import Any

TARGETS = ("v5e:2x2", "v5e:4x8", "2xv5e:2x2", "v5p:2x2x2")
EXAMPLE = "jaxcache.warmup.examples:warm"


def run(targets: list[str], entrypoint: str, parallel: int, extra: list[str]) -> dict[str, Any]:
    """One `warmup` command into an empty cache: its wall time, peak RSS, and what each target's process reported."""
    cache = tempfile.mkdtemp(prefix="jaxcache-bench-targets-")
    try:
        argv = [sys.executable, "-m", "jaxcache.warmup", *(f"--topology={t}" for t in targets), "--cache-dir", cache,
                "--entrypoint", entrypoint, "--parallel", str(parallel), "--json", *extra]
        with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
            started = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=out_file, stderr=err_file)
            _, status, usage = os.wait4(proc.pid, 0)  # the command's own peak RSS (with several targets, its own)
            wall = time.perf_counter() - started
            proc.returncode = os.waitstatus_to_exitcode(status)
            out_file.seek(0)
            err_file.seek(0)
            stdout, stderr = out_file.read().decode(), err_file.read().decode(errors="replace")
        if proc.returncode != 0:
            raise SystemExit(f"warmup failed (exit {proc.returncode}):\n{stderr[-3000:]}")
        out = json.loads(stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if "targets" not in out:  # one target: the command ran it in its own process
        out = {"targets": [{"target": out["topology"], "wall_s": round(wall, 3), "cpu_s": None,
                            "peak_rss_bytes": usage.ru_maxrss * 1024, "summary": out}]}
    # CPU seconds of the command and every process it waited for: each target's, with several.
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 1), "targets": {t["target"]: {
        "wall_s": t["wall_s"], "cpu_s": t["cpu_s"],
        "peak_rss_mib": round(t["peak_rss_bytes"] / 2**20) if t["peak_rss_bytes"] else None,
        "compile_s": t["summary"]["compile_s"], "programs": t["summary"]["programs"]} for t in out["targets"]}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", nargs="+", default=list(TARGETS))
    p.add_argument("--entrypoint", default=EXAMPLE)
    p.add_argument("--parallel", nargs="+", type=int, default=[1, 2], help="the arms (the first is the baseline)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each arm, alternating")
    p.add_argument("--libtpu-init-args", default="--xla_tpu_use_enhanced_launch_barrier=true",
                   help="the job's flags, as the lent chip's image sets them")
    args = p.parse_args()
    extra = [f"--libtpu-init-args={args.libtpu_init_args}"] if args.libtpu_init_args else []
    arms: dict[int, list[dict[str, Any]]] = {n: [] for n in args.parallel}
    loads = []
    for _ in range(args.rounds):
        for n in args.parallel:
            arms[n].append(run(args.targets, args.entrypoint, n, extra))
            loads.append(os.getloadavg()[0])
    base = statistics.median(r["wall_s"] for r in arms[args.parallel[0]])
    result: dict[str, Any] = {"targets": args.targets, "entrypoint": args.entrypoint,
                              "cpus": len(os.sched_getaffinity(0)), "load_average": round(statistics.mean(loads), 2),
                              "arms": {}}
    for n, runs in arms.items():
        median = statistics.median(r["wall_s"] for r in runs)
        result["arms"][f"parallel {n}"] = {
            "wall_s": [r["wall_s"] for r in runs], "median_wall_s": median, "cpu_s": [r["cpu_s"] for r in runs],
            "baseline_over_this": round(base / median, 3),
            "per_target": {t: {"median_wall_s": statistics.median(r["targets"][t]["wall_s"] for r in runs),
                               "cpu_s": [r["targets"][t]["cpu_s"] for r in runs],
                               "max_peak_rss_mib": max((r["targets"][t]["peak_rss_mib"] or 0) for r in runs) or None,
                               "median_compile_s": statistics.median(r["targets"][t]["compile_s"] for r in runs)}
                           for t in runs[0]["targets"]}}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
