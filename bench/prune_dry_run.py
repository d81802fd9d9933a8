"""`jaxcache prune ROOT --unused-for 30d` (the dry run, its table to /dev/null) of a local root without -atime files
(JAX's default: no size cap, so no LRU), each a fresh process, against `find ROOT -mtime +30` in the same run,
alternating, medians. The root also holds a few jams (a FIFO and a link named like entries, a FIFO as an entry's
-atime): the dry run must skip them and select exactly the entries find selects (the one assertion). What each figure
means: README.md.

    .venv/bin/python bench/prune_dry_run.py --entries 100000     # table; --json for machine-readable figures
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from entries import Progress, key_of, load_sources, make_source, write  # noqa: E402
from tables import print_rows  # noqa: E402

_TARGET_RATIO = 2.0
_DAY = 86400.0
_JAXCACHE = os.path.join(os.path.dirname(sys.executable), "jaxcache")
_JAMS = 3


def build(sources: list[tuple[str, bytes]], root: str, entries: int, now: float) -> int:
    """``entries`` real-format entries without ``-atime`` files, entry ``i`` created ``i % 60`` days (and ``i %
    3600`` seconds) ago, and the jams; returns how many entries are older than 30 days."""
    os.makedirs(root)
    old = 0
    progress = Progress(entries, f"building {entries} entries")
    try:
        for i in range(entries):
            module, data = sources[i % len(sources)]
            path = os.path.join(root, key_of(module, i) + "-cache")
            write(path, data)
            created = now - (i % 60) * _DAY - i % 3600
            os.utime(path, (created, created))
            old += now - created >= 30 * _DAY  # what --unused-for 30d selects (no -atime: last use is creation)
            progress.update()
    finally:
        progress.close()
    module = sources[0][0]
    os.mkfifo(os.path.join(root, key_of(module, entries) + "-cache"))
    os.symlink("/etc/passwd", os.path.join(root, key_of(module, entries + 1) + "-cache"))
    os.mkfifo(os.path.join(root, key_of(module, 0) + "-atime"))  # a listed entry's -atime
    return old


def timed(cmd: list[str]) -> float:
    """Wall seconds of one process, its stdout to /dev/null."""
    with open(os.devnull, "wb") as sink:
        start = time.perf_counter()
        subprocess.run(cmd, stdout=sink, check=True, timeout=600)
        return time.perf_counter() - start


def check(root: str, old: int) -> None:
    """The dry run selects the entries built older than 30 days, skips the jams, and does not hang on them."""
    out = subprocess.run([_JAXCACHE, "prune", root, "--unused-for", "30d", "--json"], capture_output=True, check=True,
                         timeout=600).stdout
    plan = json.loads(out)
    assert len(plan["delete"]) == old, (len(plan["delete"]), old)
    assert plan["skipped"] == _JAMS, plan["skipped"]


def measure(root: str, repeat: int) -> dict[str, list[float]]:
    cmds = {
        "find -mtime +30": ["find", root, "-mtime", "+30"],
        "prune --unused-for 30d (dry run)": [_JAXCACHE, "prune", root, "--unused-for", "30d"],
    }
    timed(cmds["find -mtime +30"])  # warm the page cache and the dentries: neither can be dropped without root
    runs: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(repeat):
        for label, cmd in cmds.items():
            runs[label].append(timed(cmd))
    return runs


def report(runs: dict[str, list[float]], entries: int, repeat: int) -> dict:
    med = {k: statistics.median(v) for k, v in runs.items()}
    find = med["find -mtime +30"]
    rows = {k: {"median_s": v, "vs_find": v / find, "runs": runs[k]} for k, v in med.items()}
    return {"entries": entries, "repeat": repeat, "measurements": rows, "target_ratio": _TARGET_RATIO,
            "prune_vs_find": med["prune --unused-for 30d (dry run)"] / find}


def print_table(fig: dict) -> None:
    lines = [("measurement", "median s", "vs find")] + [
        (label, f"{row['median_s']:.3f}", f"{row['vs_find']:.2f}x") for label, row in fig["measurements"].items()
    ]
    print_rows(lines)
    print(f"\n{fig['entries']} entries without -atime files (and {_JAMS} jams); medians of {fig['repeat']} rounds, "
          "each a fresh process")
    print(f"prune dry run / find: {fig['prune_vs_find']:.2f} (target <= {fig['target_ratio']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/prune_dry_run.py",
        description="Time `jaxcache prune --unused-for 30d` (dry run) of N real-format entries without -atime files "
                    "against find -mtime +30, in one run.")
    parser.add_argument("--entries", type=int, default=100_000, help="entries to build (default 100000)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; medians are reported (default 5)")
    parser.add_argument("--source", metavar="DIR",
                        help="a real JAX cache dir to copy entries from (default: make one with jaxcache.warmup.demo)")
    parser.add_argument("--workdir", metavar="DIR", help="where to build (default: a new temp dir under /tmp)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    args = parser.parse_args(argv)
    if args.entries < 1 or args.repeat < 1:
        parser.error("--entries and --repeat must be at least 1")
    workdir = tempfile.mkdtemp(prefix="jaxcache-bench-prune-dry-run-", dir=args.workdir)
    began = time.perf_counter()
    try:
        sources = load_sources(args.source or make_source(workdir))
        root = os.path.join(workdir, "root")
        old = build(sources, root, args.entries, time.time())
        check(root, old)
        fig = report(measure(root, args.repeat), args.entries, args.repeat)
    finally:
        print(f"finished in {time.perf_counter() - began:.0f}s", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(fig, indent=2))
    else:
        print_table(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
