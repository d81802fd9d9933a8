"""Repeated `jaxcache ls`/`stats` of a local root, end to end (each a fresh `jaxcache` process, as a user runs it),
against `find ROOT -printf '%s %T@ %p\\n'` (the listing any tool must do) and the raw scandir+stat+pread pass of
bench/scan.py (what reading every head costs at best), alternating, medians. "first": the head index emptied
before the call; "second": the call right after, the root unchanged (the table's first call comes after the JSON
ones: it finds the heads kept, not its table). The outputs of first, second and --no-index
calls must be equal (the one assertion). What each figure means: README.md.

    .venv/bin/python bench/listing.py --entries 100000          # table; --json for machine-readable figures
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

_TARGET_RATIO = 1.5
_HERE = os.path.dirname(os.path.abspath(__file__))
_JAXCACHE = os.path.join(os.path.dirname(sys.executable), "jaxcache")


def build(sources: list[tuple[str, bytes]], root: str, entries: int) -> None:
    """``entries`` real-format entries, each with its ``-atime`` file (as JAX's LRU writes them)."""
    import struct

    pack_atime = struct.Struct("<Q").pack
    os.makedirs(root)
    progress = Progress(entries, f"building {entries} entries")
    try:
        for i in range(entries):
            module, data = sources[i % len(sources)]
            key = key_of(module, i)
            write(os.path.join(root, key + "-cache"), data)
            write(os.path.join(root, key + "-atime"), pack_atime(time.time_ns()))
            progress.update()
    finally:
        progress.close()


def timed(cmd: list[str], env: dict[str, str], out: str | None = None) -> float:
    """Wall seconds of one process, its stdout to ``out`` (or /dev/null)."""
    with open(out or os.devnull, "wb") as sink:
        start = time.perf_counter()
        subprocess.run(cmd, stdout=sink, env=env, check=True)
        return time.perf_counter() - start


def measure(root: str, index_dir: str, repeat: int) -> dict[str, list[float]]:
    env = {**os.environ, "JAXCACHE_INDEX_DIR": index_dir}
    env.pop("JAXCACHE_INDEX", None)
    commands = {
        "find -printf": ["find", root, "-printf", "%s %T@ %p\\n"],
        "raw pass": [sys.executable, os.path.join(_HERE, "scan.py"), "--child", "baseline", root],
        "ls --json": [_JAXCACHE, "ls", root, "--json"],
        "stats --json": [_JAXCACHE, "stats", root, "--json"],
        "ls (table)": [_JAXCACHE, "ls", root],
    }

    def fresh_index() -> None:
        shutil.rmtree(index_dir, ignore_errors=True)

    print("warm-up: one untimed raw pass and find", file=sys.stderr)
    timed(commands["raw pass"], env)
    timed(commands["find -printf"], env)
    runs: dict[str, list[float]] = {k: [] for k in (
        "find -printf", "raw pass", "ls --json first", "ls --json second", "stats --json first",
        "stats --json second", "ls (table) first", "ls (table) second")}
    for r in range(repeat):
        print(f"round {r + 1}/{repeat}", file=sys.stderr)
        runs["find -printf"].append(timed(commands["find -printf"], env))
        runs["raw pass"].append(timed(commands["raw pass"], env))
        fresh_index()
        runs["ls --json first"].append(timed(commands["ls --json"], env))
        runs["ls --json second"].append(timed(commands["ls --json"], env))
        runs["find -printf"].append(timed(commands["find -printf"], env))
        fresh_index()
        runs["stats --json first"].append(timed(commands["stats --json"], env))
        runs["stats --json second"].append(timed(commands["stats --json"], env))
        # The table's own first call finds the heads kept (by the calls above), not the table.
        runs["ls (table) first"].append(timed(commands["ls (table)"], env))
        runs["ls (table) second"].append(timed(commands["ls (table)"], env))
        runs["raw pass"].append(timed(commands["raw pass"], env))
    return runs


def check_outputs(root: str, index_dir: str, workdir: str, entries: int) -> None:
    """ls and stats print the same JSON with a fresh index, a warm one and none."""
    env = {**os.environ, "JAXCACHE_INDEX_DIR": index_dir}
    for command in ("ls", "stats"):
        shutil.rmtree(index_dir, ignore_errors=True)
        outs = []
        for how, extra in (("first", []), ("second", []), ("none", ["--no-index"])):
            path = os.path.join(workdir, f"{command}-{how}.json")
            timed([_JAXCACHE, command, root, "--json", *extra], env, out=path)
            with open(path, "rb") as f:
                outs.append(json.load(f))
            os.unlink(path)
        assert outs[0] == outs[1] == outs[2], f"{command} --json differs with the head index"
        got = len(outs[0]["entries"]) if command == "ls" else outs[0]["entries"]
        assert got == entries, f"{command} counted {got} entries, built {entries}"


def report(runs: dict[str, list[float]], entries: int, repeat: int, index_bytes: int) -> dict:
    med = {k: statistics.median(v) for k, v in runs.items()}
    find, raw = med["find -printf"], med["raw pass"]
    rows = {k: {"median_s": v, "vs_find": v / find, "vs_raw_pass": v / raw, "runs": runs[k]} for k, v in med.items()}
    return {
        "entries": entries, "repeat": repeat, "index_file_bytes": index_bytes, "measurements": rows,
        "target_ratio": _TARGET_RATIO,
        "second_ls_vs_find": med["ls --json second"] / find,
        "second_stats_vs_find": med["stats --json second"] / find,
        "second_table_vs_find": med["ls (table) second"] / find,
        "first_ls_vs_raw_pass": med["ls --json first"] / raw,
        "first_stats_vs_raw_pass": med["stats --json first"] / raw,
    }


def print_table(fig: dict) -> None:
    header = ("measurement", "median s", "vs find", "vs raw pass")
    lines = [header] + [
        (label, f"{row['median_s']:.3f}", f"{row['vs_find']:.2f}x", f"{row['vs_raw_pass']:.2f}x")
        for label, row in fig["measurements"].items()
    ]
    print_rows(lines)
    t = fig["target_ratio"]
    print(f"\n{fig['entries']} entries with -atime files; medians of {fig['repeat']} rounds (find and the raw pass "
          f"twice a round), each a fresh process; head index file {fig['index_file_bytes'] / 2**20:.1f} MiB")
    print(f"second ls --json / find: {fig['second_ls_vs_find']:.2f} (target <= {t}); second stats --json / find: "
          f"{fig['second_stats_vs_find']:.2f}; second ls (table) / find: {fig['second_table_vs_find']:.2f}")
    print(f"first ls --json / raw pass: {fig['first_ls_vs_raw_pass']:.2f} (target <= {t}); first stats --json / raw "
          f"pass: {fig['first_stats_vs_raw_pass']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/listing.py",
        description="Time a first and a repeated `jaxcache ls`/`stats` of N real-format entries against find -printf "
                    "and a raw scandir/stat/pread pass, in one run.")
    parser.add_argument("--entries", type=int, default=100_000, help="entries to build (default 100000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (default 3)")
    parser.add_argument("--source", metavar="DIR",
                        help="a real JAX cache dir to copy entries from (default: make one with jaxcache.warmup.demo)")
    parser.add_argument("--workdir", metavar="DIR", help="where to build (default: a new temp dir under /tmp)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    args = parser.parse_args(argv)
    if args.entries < 1 or args.repeat < 1:
        parser.error("--entries and --repeat must be at least 1")
    workdir = tempfile.mkdtemp(prefix="jaxcache-bench-listing-", dir=args.workdir)
    began = time.perf_counter()
    try:
        sources = load_sources(args.source or make_source(workdir))
        root = os.path.join(workdir, "root")
        index_dir = os.path.join(workdir, "index")
        build(sources, root, args.entries)
        check_outputs(root, index_dir, workdir, args.entries)
        runs = measure(root, index_dir, args.repeat)
        index_bytes = sum(e.stat().st_size for e in os.scandir(index_dir))
        fig = report(runs, args.entries, args.repeat, index_bytes)
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
