"""The ``jaxcache`` command: the one composition root that wires storage, scanning and output together.

Exit codes: 0 ok, 1 problems found (``doctor``), 2 usage or input error.
"""

from __future__ import annotations

import argparse
import fnmatch
import heapq
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from jaxcache import __version__
from jaxcache.doctor import Diagnosis, check, diagnose
from jaxcache.errors import JaxcacheError
from jaxcache.scan import Entry, Record, scan
from jaxcache.stats import CacheStats, summarize
from jaxcache.storage import Storage, open_storage
from jaxcache.table import render
from jaxcache.units import format_bytes, format_duration

T = TypeVar("T")

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2

_SORTS: dict[str, tuple[Callable[[Entry], Any], bool]] = {
    # name: (key, largest-first)
    "size": (lambda e: e.size_bytes, True),
    "compile": (lambda e: -1 if e.compile_seconds is None else e.compile_seconds, True),
    "age": (lambda e: e.mtime_s, False),  # oldest first
    "name": (lambda e: e.key, False),
}

_ROOT_HELP = "cache root: a directory, file:///path, or gs://bucket/prefix"


def _progress(items: Iterable[T], what: str) -> Iterator[T]:
    """Count records on stderr while a long scan runs; silent unless stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=what, unit=" entries", leave=False, file=sys.stderr, mininterval=0.2)


def _entry_json(e: Entry) -> dict[str, Any]:
    return {
        "key": e.key,
        "function": e.module,
        "hash": e.hash,
        "size_bytes": e.size_bytes,
        "compression": e.compression.value if e.compression else None,
        "compile_seconds": e.compile_seconds,
        "status": e.status.value if e.status else None,
        "reason": e.reason,
        "created_s": e.mtime_s,
        "last_used_s": e.last_used_s,
        "has_atime": e.atime_ns is not None,
    }


def _select(records: Iterable[Record], function: str | None) -> Iterator[Entry]:
    for r in records:
        if isinstance(r, Entry) and (function is None or fnmatch.fnmatchcase(r.module, function)):
            yield r


def cmd_ls(args: argparse.Namespace, storage: Storage) -> int:
    entries = _select(_progress(scan(storage), "scanning"), args.function)
    key, largest_first = _SORTS[args.sort]
    if args.limit is not None:
        pick = heapq.nlargest if largest_first else heapq.nsmallest
        chosen = pick(args.limit, entries, key=key)
    else:
        chosen = sorted(entries, key=key, reverse=largest_first)
    if args.json:
        json.dump({"root": storage.url, "entries": [_entry_json(e) for e in chosen]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    now = time.time()
    rows = [
        [
            e.module,
            e.hash[:12],
            format_bytes(e.size_bytes),
            "?" if e.compile_seconds is None else f"{e.compile_seconds} s",
            format_duration(now - e.mtime_s),
            format_duration(now - e.last_used_s) if e.atime_ns is not None else "-",
            e.compression.value if e.compression else "?",
            e.status.value if e.status else "?",
        ]
        for e in chosen
    ]
    headers = ["FUNCTION", "HASH", "SIZE", "COMPILE", "AGE", "LAST USED", "COMPRESSION", "STATUS"]
    print(render(headers, rows, right=frozenset({2, 3, 4, 5})))
    print(f"{len(rows)} entries, {format_bytes(sum(e.size_bytes for e in chosen))} in {storage.url}")
    return EXIT_OK


def _stats_json(storage: Storage, s: CacheStats) -> dict[str, Any]:
    return {
        "root": storage.url,
        "entries": s.entries,
        "size_bytes": s.size_bytes,
        "compile_seconds": s.compile_seconds,
        "with_atime": s.with_atime,
        "compression": dict(sorted(s.by_compression.items())),
        "mixed_compression": s.mixed_compression,
        "corrupt": s.corrupt,
        "orphans": s.orphans,
        "orphan_bytes": s.orphan_bytes,
        "oldest_created_s": s.oldest_mtime_s,
        "newest_created_s": s.newest_mtime_s,
        "by_function": [
            {"function": name, "entries": f.entries, "size_bytes": f.size_bytes, "compile_seconds": f.compile_seconds}
            for name, f in sorted(s.by_function.items(), key=lambda kv: (-kv[1].size_bytes, kv[0]))
        ],
    }


def cmd_stats(args: argparse.Namespace, storage: Storage) -> int:
    s = summarize(_progress(scan(storage), "scanning"))
    data = _stats_json(storage, s)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    now = time.time()
    mix = ", ".join(f"{k} {v}" for k, v in sorted(s.by_compression.items())) or "-"
    summary = [
        ["root", storage.url],
        ["entries", f"{s.entries} ({s.with_atime} with an -atime record)"],
        ["size", format_bytes(s.size_bytes)],
        ["compile time stored", f"{s.compile_seconds} s (JAX stores whole seconds; most small programs store 0)"],
        ["compression", mix],
        ["corrupt (header check)", f"{s.corrupt}" + (" - run `jaxcache doctor` for details" if s.corrupt else "")],
        ["orphaned -atime files", f"{s.orphans} ({format_bytes(s.orphan_bytes)})"],
    ]
    if s.oldest_mtime_s is not None and s.newest_mtime_s is not None:
        summary.append(["oldest / newest entry",
                        f"{format_duration(now - s.oldest_mtime_s)} / {format_duration(now - s.newest_mtime_s)} ago"])
    width = max(len(k) for k, _ in summary)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in summary))
    if s.mixed_compression:
        print("\nwarning: both zstd and zlib entries: run `jaxcache doctor` for what that means")
    top = data["by_function"][: args.top]
    if top:
        print(f"\nby function (top {len(top)} of {len(data['by_function'])} by size):")
        rows = [[f["function"], str(f["entries"]), format_bytes(f["size_bytes"]), f"{f['compile_seconds']} s"]
                for f in top]
        print(render(["FUNCTION", "ENTRIES", "SIZE", "COMPILE"], rows, right=frozenset({1, 2, 3})))
    return EXIT_OK


def _doctor_json(storage: Storage, d: Diagnosis) -> dict[str, Any]:
    return {
        "root": storage.url,
        "checked": d.stats.entries,
        "ok": d.stats.entries - d.stats.corrupt,
        "corrupt": [{"name": f.name, "key": f.key, "reason": f.reason} for f in d.corrupt],
        "orphans": [{"name": f.name, "key": f.key} for f in d.orphans],
        "compression": dict(sorted(d.stats.by_compression.items())),
        "mixed_compression": d.stats.mixed_compression,
        "advice": d.advice,
        "problems": d.problems,
    }


def cmd_doctor(args: argparse.Namespace, storage: Storage) -> int:
    d = diagnose(_progress(check(storage), "checking"))
    exit_code = EXIT_PROBLEMS if d.problems else EXIT_OK
    if args.json:
        json.dump(_doctor_json(storage, d), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return exit_code
    s = d.stats
    mix = ", ".join(f"{k} {v}" for k, v in sorted(s.by_compression.items())) or "-"
    print(f"checked {s.entries} entries in {storage.url}: {s.entries - s.corrupt} ok, {s.corrupt} corrupt, "
          f"{s.orphans} orphaned -atime files; compression: {mix}")
    if d.corrupt:
        print(f"\ncorrupt entries ({len(d.corrupt)}):")
        print(render(["FILE", "REASON"], [[f.name, f.reason] for f in d.corrupt]))
    if d.orphans:
        print(f"\norphaned -atime files ({len(d.orphans)}):")
        print("\n".join(f.name for f in d.orphans))
    for note in d.advice:
        print(f"\nnote: {note}")
    if not d.problems:
        print("no problems found")
    return exit_code


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, exposed for tests and for the README's help text."""
    parser = argparse.ArgumentParser(
        prog="jaxcache",
        description="Inspect and manage JAX persistent compilation caches on local/NFS directories and GCS.",
        epilog="Exit codes: 0 ok, 1 problems found (doctor), 2 usage or input error.",
    )
    parser.add_argument("--version", action="version", version=f"jaxcache {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = sub.add_parser("ls", help="list the entries of a cache root",
                        description="List compiled programs in a cache root with size, stored compile "
                                    "seconds, age and compression.")
    ls.add_argument("root", metavar="ROOT", help=_ROOT_HELP)
    ls.add_argument("--json", action="store_true", help="print JSON (stable field names) instead of a table")
    ls.add_argument("--sort", choices=sorted(_SORTS), default="name",
                    help="order: size and compile largest first, age oldest first, name A-Z (default: name)")
    ls.add_argument("--function", metavar="GLOB", help="only functions (module names) matching GLOB, e.g. 'jit_train*'")
    ls.add_argument("--limit", metavar="N", type=_non_negative, help="show at most N entries")
    ls.set_defaults(run=cmd_ls)

    st = sub.add_parser("stats", help="totals for a cache root",
                        description="Entries, bytes, stored compile seconds, compression mix, corrupt entries "
                                    "(from a header check) and orphaned -atime files, with a per-function table.")
    st.add_argument("root", metavar="ROOT", help=_ROOT_HELP)
    st.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    st.add_argument("--top", metavar="N", type=_non_negative, default=20,
                    help="functions to show in the table (default 20; --json lists all)")
    st.set_defaults(run=cmd_stats)

    dr = sub.add_parser("doctor", help="validate every entry and explain what is wrong",
                        description="Decompress every entry, list corrupt ones with the reason, list orphaned "
                                    "-atime files, and explain mixed compression. Exits 1 if anything needs "
                                    "attention.")
    dr.add_argument("root", metavar="ROOT", help=_ROOT_HELP)
    dr.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    dr.set_defaults(run=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        storage = open_storage(args.root)
        return args.run(args, storage)
    except JaxcacheError as exc:
        print(f"jaxcache: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("jaxcache: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `jaxcache ls ROOT | head`: the reader left; that is not an error. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
