"""jaxcache's directory scanner (``scan`` and ``summarize``, what ``ls`` and ``stats`` run) against the tightest
hand-written loop that gets the same answers (``scandir`` + ``stat`` + ``pread`` + decompress), each in a fresh
interpreter; ratios of medians, and peak RSS at N/10 and N entries. The readers must agree on every total (the
one assertion). What each figure means: README.md.

    .venv/bin/python bench/scan.py --entries 100000          # table; --json for machine-readable figures
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
_KINDS = ("baseline", "scan", "summarize")


# --------------------------------------------------------------------------------------------------------------
# The measurements. Each runs in its own child process (``--child KIND DIR``); imports stay inside the functions
# so a child's peak RSS holds only what its reader needs.


def baseline(root: str) -> dict[str, int]:
    """The tightest loop: one scandir, one stat per file, one open+pread (two for a zstd entry) per file."""
    import struct
    import zlib

    import zstandard

    zstd = zstandard.ZstdDecompressor()
    magic = b"\x28\xb5\x2f\xfd"
    unpack_atime = struct.Struct("<Q").unpack
    o_rdonly = os.O_RDONLY
    entries = seconds = size_bytes = atime_files = atime_sum = 0
    with os.scandir(root) as it:
        for de in it:
            name = de.name
            st = de.stat()
            if name.endswith("-cache"):
                fd = os.open(de.path, o_rdonly)
                try:
                    data = os.pread(fd, 256, 0)
                    dec = zstd.decompressobj() if data[:4] == magic else zlib.decompressobj()
                    out = dec.decompress(data)
                    if len(out) < 4 and len(data) < st.st_size:
                        out += dec.decompress(os.pread(fd, st.st_size - len(data), len(data)))
                finally:
                    os.close(fd)
                entries += 1
                size_bytes += st.st_size
                seconds += int.from_bytes(out[:4], "big")
            elif name.endswith("-atime"):
                fd = os.open(de.path, o_rdonly)
                try:
                    raw = os.pread(fd, 8, 0)
                finally:
                    os.close(fd)
                atime_files += 1
                atime_sum += unpack_atime(raw)[0]
    return {"entries": entries, "compile_seconds": seconds, "size_bytes": size_bytes, "atime_files": atime_files,
            "atime_sum": atime_sum}


def jaxcache_scan(root: str) -> dict[str, int]:
    """Iterate ``scan(open_storage(root))``, folding the same figures as :func:`baseline`."""
    from jaxcache.scan import Entry, scan
    from jaxcache.storage import open_storage

    entries = seconds = size_bytes = atime_files = atime_sum = other = 0
    for record in scan(open_storage(root)):
        if isinstance(record, Entry):
            entries += 1
            seconds += record.compile_seconds or 0
            size_bytes += record.size_bytes
            if record.atime_ns is not None:
                atime_files += 1
                atime_sum += record.atime_ns
        else:
            other += 1  # an orphaned -atime file: there are none in a built directory
    return {"entries": entries, "compile_seconds": seconds, "size_bytes": size_bytes, "atime_files": atime_files,
            "atime_sum": atime_sum, "orphans": other}


def jaxcache_summarize(root: str) -> dict[str, int]:
    """``summarize(scan(storage))``: what ``jaxcache stats`` computes."""
    from jaxcache.scan import scan
    from jaxcache.stats import summarize
    from jaxcache.storage import open_storage

    stats = summarize(scan(open_storage(root)))
    return {"entries": stats.entries, "compile_seconds": stats.compile_seconds, "size_bytes": stats.size_bytes,
            "atime_files": stats.with_atime, "orphans": stats.orphans}


_READERS = {"baseline": baseline, "scan": jaxcache_scan, "summarize": jaxcache_summarize}
# Imported before the clock starts: the timings are of the walk, not of interpreter warm-up.
_PRELOAD = {
    "baseline": ("struct", "zlib", "zstandard"),
    "scan": ("jaxcache.scan", "jaxcache.storage"),
    "summarize": ("jaxcache.scan", "jaxcache.stats", "jaxcache.storage"),
}


def _peak_rss_mib() -> tuple[float, str]:
    """This process's own peak RSS in MiB, and where the figure came from.

    ``getrusage(RUSAGE_SELF).ru_maxrss`` is not enough on its own: Linux keeps ``maxrss`` across ``execve``, so a
    child started by ``subprocess`` reports at least its parent's peak (the builder's, here). ``VmHWM`` in
    ``/proc/self/status`` belongs to the address space the exec created, so it is the child's own.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024, "VmHWM"
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024), "ru_maxrss"


def child(kind: str, root: str) -> int:
    """Run one measurement and print its figures as one JSON line on stdout."""
    import importlib

    reader = _READERS[kind]
    for module in _PRELOAD[kind]:
        importlib.import_module(module)
    start = time.perf_counter()
    figures = reader(root)
    elapsed = time.perf_counter() - start
    peak, source = _peak_rss_mib()
    print(json.dumps({"kind": kind, "seconds": elapsed, "peak_rss_mib": peak, "rss_source": source, **figures}))
    return 0


def run_child(kind: str, root: str) -> dict:
    """Run :func:`child` in a fresh interpreter and return its figures."""
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", kind, root],
        stdout=subprocess.PIPE, text=True, check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------------------
# Building the directories.


def build(sources: list[tuple[str, bytes]], big: str, small: str, entries: int) -> None:
    """Write ``entries`` entries (+ ``-atime`` files) into ``big``; the first ``entries // 10`` also into ``small``.

    Entry ``i`` gets the bytes of source ``i % len(sources)`` under the key ``<module>-<sha256(str(i))>``.
    """
    import struct

    pack_atime = struct.Struct("<Q").pack
    n_small = entries // 10
    os.makedirs(big)
    os.makedirs(small)
    progress = Progress(entries, f"building {entries} entries")
    try:
        for i in range(entries):
            module, data = sources[i % len(sources)]
            key = key_of(module, i)
            atime = pack_atime(time.time_ns())
            dirs = (big, small) if i < n_small else (big,)
            for d in dirs:
                write(os.path.join(d, key + "-cache"), data)
                write(os.path.join(d, key + "-atime"), atime)
            progress.update()
    finally:
        progress.close()


# --------------------------------------------------------------------------------------------------------------
# Running and reporting.

_CHECKED = ("entries", "compile_seconds", "size_bytes", "atime_files")


def check_agree(results: list[dict], expected_entries: int) -> None:
    """All readers must report the same figures (correctness, not timing)."""
    ref = results[0]
    kind = ref["kind"]
    assert ref["entries"] == expected_entries, f"{kind} counted {ref['entries']} entries, built {expected_entries}"
    assert ref["atime_files"] == expected_entries, f"{kind} saw {ref['atime_files']} -atime files"
    for r in results[1:]:
        for field in _CHECKED:
            assert r[field] == ref[field], f"{r['kind']} {field}={r[field]} but {ref['kind']} {field}={ref[field]}"
        if "atime_sum" in r:
            assert r["atime_sum"] == ref["atime_sum"], f"{r['kind']} atime sum differs from {ref['kind']}"
        assert r.get("orphans", 0) == 0, f"{r['kind']} reported {r['orphans']} orphans; none were built"


def measure(big: str, small: str, entries: int, repeat: int) -> dict:
    """Warm the page cache, then ``repeat`` alternating rounds; returns every run's figures."""
    print("warm-up: one untimed baseline pass over each directory", file=sys.stderr)
    run_child("baseline", big)
    run_child("baseline", small)
    plan = [("baseline", big), ("scan", big), ("summarize", big), ("baseline", small), ("scan", small)]
    runs: dict[str, list[dict]] = {f"{k}@{'N' if d == big else 'N/10'}": [] for k, d in plan}
    for r in range(repeat):
        print(f"round {r + 1}/{repeat}: " + ", ".join(runs), file=sys.stderr)
        for kind, d in plan:
            label = f"{kind}@{'N' if d == big else 'N/10'}"
            runs[label].append(run_child(kind, d))
        check_agree([runs[f"{k}@N"][-1] for k in _KINDS], entries)
        check_agree([runs["baseline@N/10"][-1], runs["scan@N/10"][-1]], entries // 10)
    return runs


def report(runs: dict[str, list[dict]], entries: int, repeat: int) -> dict:
    """Medians per measurement and the two headline ratios."""
    rows = {}
    for label, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        rows[label] = {
            "entries": results[0]["entries"],
            "seconds": seconds,
            "entries_per_s": results[0]["entries"] / seconds if seconds else None,
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in results),
        }
    for label, row in rows.items():
        base = rows["baseline@" + label.split("@")[1]]["seconds"]
        row["time_vs_baseline"] = row["seconds"] / base if base else None
    big, small = rows["scan@N"], rows["scan@N/10"]
    first = runs["baseline@N"][0]
    return {
        "entries": entries,
        "repeat": repeat,
        "compile_seconds_sum": first["compile_seconds"],
        "size_bytes": first["size_bytes"],
        "measurements": rows,
        "scan_vs_baseline_time": rows["scan@N"]["time_vs_baseline"],
        "summarize_vs_baseline_time": rows["summarize@N"]["time_vs_baseline"],
        "target_time_ratio": _TARGET_RATIO,
        "scan_peak_rss_mib_small": small["peak_rss_mib"],
        "scan_peak_rss_mib_big": big["peak_rss_mib"],
        "scan_peak_rss_ratio_big_vs_small": big["peak_rss_mib"] / small["peak_rss_mib"],
        "rss_source": first["rss_source"],
    }


def print_table(fig: dict) -> None:
    header = ("measurement", "entries", "median s", "entries/s", "vs baseline", "peak RSS MiB")
    lines = [header]
    for label, row in fig["measurements"].items():
        lines.append((
            label, str(row["entries"]), f"{row['seconds']:.3f}", f"{row['entries_per_s']:,.0f}",
            f"{row['time_vs_baseline']:.2f}x", f"{row['peak_rss_mib']:.1f}",
        ))
    print_rows(lines)
    mib = fig["size_bytes"] / (1024 * 1024)
    print(f"\n{fig['entries']} entries ({mib:,.0f} MiB of -cache files); medians of {fig['repeat']} runs, "
          "each in a fresh process")
    print(f"all readers agree: compile-seconds sum {fig['compile_seconds_sum']}, {fig['size_bytes']:,} bytes")
    print(f"scan/baseline time ratio: {fig['scan_vs_baseline_time']:.2f} (target <= {fig['target_time_ratio']})")
    print(f"summarize/baseline time ratio: {fig['summarize_vs_baseline_time']:.2f}")
    print(f"peak RSS at N/10 vs N: {fig['scan_peak_rss_mib_small']:.1f} MiB vs {fig['scan_peak_rss_mib_big']:.1f} MiB "
          f"(ratio {fig['scan_peak_rss_ratio_big_vs_small']:.2f}; flat is ~1.0; each child's own {fig['rss_source']})")


def _check_space(workdir: str, sources: list[tuple[str, bytes]], entries: int) -> None:
    per_entry = sum(len(d) for _, d in sources) / len(sources)
    # Each file takes at least one block; 4 KiB is the common size. 1.1 for the N/10 copy.
    need = int(1.1 * entries * (max(per_entry, 4096) + 4096))
    free = shutil.disk_usage(workdir).free
    print(f"{len(sources)} source entries, {per_entry / 1024:.1f} KiB on average; about {need / 2**20:,.0f} MiB "
          f"needed in {workdir}", file=sys.stderr)
    if need > free:
        sys.exit(f"error: {workdir} has {free / 2**20:,.0f} MiB free, about {need / 2**20:,.0f} MiB needed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/scan.py",
        description="Time jaxcache's scanner against a raw os.scandir/pread loop on N real-format cache entries; "
        "report time and peak-RSS ratios measured in one run.",
    )
    parser.add_argument("--entries", type=int, default=100_000, help="entries to build (default 100000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; medians are reported (default 3)")
    parser.add_argument("--source", metavar="DIR",
                        help="a real JAX cache dir to copy entries from (default: make one with jaxcache.warmup.demo)")
    parser.add_argument("--workdir", metavar="DIR", help="where to build (default: a new temp dir under /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the built directories instead of removing them")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, root = args.child
        if kind not in _READERS:
            parser.error(f"--child: unknown kind {kind!r}")
        return child(kind, root)
    if args.entries < 10:
        parser.error("--entries must be at least 10 (the memory check uses N/10)")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    began = time.perf_counter()
    created: list[str] = []
    if args.workdir:
        workdir = os.path.abspath(args.workdir)
        if not os.path.isdir(workdir):
            os.makedirs(workdir)
            created.append(workdir)
    else:
        workdir = tempfile.mkdtemp(prefix="jaxcache-bench-")
        created.append(workdir)
    big = os.path.join(workdir, f"entries-{args.entries}")
    small = os.path.join(workdir, f"entries-{args.entries // 10}")
    for d in (big, small):
        if os.path.exists(d):
            sys.exit(f"error: {d} already exists; remove it or pick another --workdir")
    try:
        if args.source:
            source = args.source
        else:
            source = make_source(workdir)
            created.append(source)
        sources = load_sources(source)
        _check_space(workdir, sources, args.entries)
        created += [big, small]
        start = time.perf_counter()
        build(sources, big, small, args.entries)
        print(f"built {big} and {small} in {time.perf_counter() - start:.1f}s", file=sys.stderr)
        runs = measure(big, small, args.entries, args.repeat)
        fig = report(runs, args.entries, args.repeat)
    finally:
        print(f"finished in {time.perf_counter() - began:.0f}s", file=sys.stderr)
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            for d in reversed(created):
                shutil.rmtree(d, ignore_errors=True)
    if args.json:
        print(json.dumps(fig, indent=2))
    else:
        print_table(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
