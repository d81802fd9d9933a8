"""``jaxcache ls`` and ``jaxcache stats``: a root's entries and their totals, straight from storage."""

from __future__ import annotations

import argparse
import fnmatch
import heapq
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jaxcache.cli.output import EXIT_OK, ROOT_HELP, non_negative, print_json, progress
from jaxcache.scan import Entry, Record, scan
from jaxcache.stats import CacheStats, summarize
from jaxcache.storage import Storage
from jaxcache.table import render
from jaxcache.units import format_bytes, format_duration

SORTS: dict[str, tuple[Callable[[Entry], Any], bool]] = {
    # name: (key, largest-first)
    "size": (lambda e: e.size_bytes, True),
    "compile": (lambda e: -1 if e.compile_seconds is None else e.compile_seconds, True),
    "age": (lambda e: e.mtime_s, False),  # oldest first
    "name": (lambda e: e.key, False),
}


def entry_json(e: Entry) -> dict[str, Any]:
    """One entry as ``ls --json`` prints it (stable field names)."""
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
    entries = _select(progress(scan(storage), "scanning"), args.function)
    key, largest_first = SORTS[args.sort]
    if args.limit is not None:
        pick = heapq.nlargest if largest_first else heapq.nsmallest
        chosen = pick(args.limit, entries, key=key)
    else:
        chosen = sorted(entries, key=key, reverse=largest_first)
    if args.json:
        print_json({"root": storage.url, "entries": [entry_json(e) for e in chosen]})
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


def stats_json(storage: Storage, s: CacheStats) -> dict[str, Any]:
    """``stats --json`` (stable field names)."""
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
    s = summarize(progress(scan(storage), "scanning"))
    data = stats_json(storage, s)
    if args.json:
        print_json(data)
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


def add_parsers(sub: Any) -> None:
    """``ls`` and ``stats``."""
    ls = sub.add_parser("ls", help="list the entries of a cache root",
                        description="List compiled programs in a cache root with size, stored compile "
                                    "seconds, age and compression.")
    ls.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    ls.add_argument("--json", action="store_true", help="print JSON (stable field names) instead of a table")
    ls.add_argument("--sort", choices=sorted(SORTS), default="name",
                    help="order: size and compile largest first, age oldest first, name A-Z (default: name)")
    ls.add_argument("--function", metavar="GLOB", help="only functions (module names) matching GLOB, e.g. 'jit_train*'")
    ls.add_argument("--limit", metavar="N", type=non_negative, help="show at most N entries")
    ls.set_defaults(run=cmd_ls)

    st = sub.add_parser("stats", help="totals for a cache root",
                        description="Entries, bytes, stored compile seconds, compression mix, corrupt entries "
                                    "(from a header check) and orphaned -atime files, with a per-function table.")
    st.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    st.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    st.add_argument("--top", metavar="N", type=non_negative, default=20,
                    help="functions to show in the table (default 20; --json lists all)")
    st.set_defaults(run=cmd_stats)
