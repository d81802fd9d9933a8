"""``jaxcache ls`` and ``jaxcache stats``: a root's entries and their totals, from storage and the head index.

Which figures need an entry's head (its first bytes): compile seconds, compression and the corrupt check. ``stats``
shows all three, so it reads every head (once per object: the head index keeps them). ``ls`` shows them too, and
reads them on a directory, where a head costs a local read; on gs:// roots, where each costs a request, only with
``--heads`` or ``--sort compile``. Sizes, ages, names and last use come from the listing and the ``-atime`` files.
"""

from __future__ import annotations

import argparse
import fnmatch
import heapq
import time
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import Any

import msgspec

from jaxcache.answers import KeptAnswer
from jaxcache.cli import ls_table
from jaxcache.cli.indexed import INDEX_HELP, IndexedRoot
from jaxcache.cli.output import EXIT_OK, ROOT_HELP, json_text, non_negative, progress, send_out, write_out
from jaxcache.display import shown
from jaxcache.entry import Compression, Status
from jaxcache.errors import InvalidInputError
from jaxcache.scan import Entry, Record
from jaxcache.stats import CacheStats, summarize
from jaxcache.storage import Storage, is_object_store
from jaxcache.table import render
from jaxcache.units import format_bytes, format_duration, plural

# Each order ascending, and total (ties broken by key): the same entries print in the same order whatever order the
# listing (or the index) gave them in.
SORTS: dict[str, Callable[[Entry], Any]] = {
    "size": lambda e: (-e.size_bytes, e.key),  # largest first
    "compile": lambda e: (1 if e.compile_seconds is None else -e.compile_seconds, e.key),  # longest first, unknown last
    "age": lambda e: (e.mtime_s, e.key),  # oldest first
    "name": lambda e: e.key,
}
#: The sorts that need every entry's head.
HEAD_SORTS = frozenset({"compile"})


class EntryJson(msgspec.Struct, gc=False):
    """One entry as ``ls --json`` prints it: the field names are the stable JSON (a Struct, not a dict: ``ls`` of a
    large root builds one per entry)."""

    key: str
    function: str
    hash: str
    size_bytes: int
    compression: Compression | None
    compile_seconds: int | None
    status: Status | None
    reason: str | None
    created_s: float
    last_used_s: float
    has_atime: bool


def entry_row(e: Entry) -> EntryJson:
    """One entry for ``ls --json``."""
    atime_ns = e.atime_ns
    return EntryJson(
        e.key, e.module, e.hash, e.size_bytes, e.compression, e.compile_seconds, e.status, e.reason, e.mtime_s,
        e.mtime_s if atime_ns is None else max(e.mtime_s, atime_ns / 1e9), atime_ns is not None,
    )


def entry_json(e: Entry) -> dict[str, Any]:
    """One entry as ``ls --json`` prints it (stable field names), as plain JSON values."""
    data: dict[str, Any] = msgspec.to_builtins(entry_row(e))
    return data


def _sent(kept: KeptAnswer | None) -> bool:
    """Whether the kept answer was printed (it holds for this listing)."""
    f = kept.open() if kept is not None else None
    if f is None:
        return False
    with f:
        send_out(f)
    return True


def reads_heads(args: argparse.Namespace, storage: Storage) -> bool:
    """Whether ``ls`` reads entries' heads: ``--heads``/``--no-heads``, else on a directory, or for ``--sort
    compile``."""
    if args.heads is not None:
        return bool(args.heads)
    return args.sort in HEAD_SORTS or not is_object_store(storage.url)


def _select(records: Iterable[Record], function: str | None) -> Iterator[Entry]:
    for r in records:
        if isinstance(r, Entry) and (function is None or fnmatch.fnmatchcase(r.module, function)):
            yield r


def _sorted(entries: Iterable[Entry], sort: str, limit: int | None) -> list[Entry]:
    key = SORTS[sort]
    if limit is not None:
        return heapq.nsmallest(limit, entries, key=key)
    # Whole roots (100k entries and more): C-level keys, ties by key through sort stability (reverse keeps it).
    by_key = sorted(entries, key=_KEY)
    if sort == "size":
        by_key.sort(key=_SIZE, reverse=True)
    elif sort == "age":
        by_key.sort(key=_MTIME)
    elif sort != "name":
        by_key.sort(key=key)
    return by_key


_KEY, _SIZE, _MTIME = attrgetter("key"), attrgetter("size_bytes"), attrgetter("mtime_s")


def cmd_ls(args: argparse.Namespace, storage: Storage) -> int:
    heads = reads_heads(args, storage)
    if args.sort in HEAD_SORTS and not heads:
        raise InvalidInputError(f"--sort {args.sort} needs every entry's head: drop --no-heads")
    source = IndexedRoot(storage, use_index=not args.no_index)
    options = (heads, args.sort, args.limit, args.function)
    if args.json:
        kept = source.kept("ls", options)
        if _sent(kept):
            return EXIT_OK
    else:  # the table's ages move with the clock: its kept part is the rest, printed with ages of now
        kept = source.kept("ls-table", options)
        table = ls_table.decode(answer) if kept is not None and (answer := kept.get()) is not None else None
        if table is not None:
            write_out(table.render(time.time()))
            return EXIT_OK
    entries = _select(progress(source.records(read_headers=heads), "scanning"), args.function)
    chosen = _sorted(entries, args.sort, args.limit)
    skipped = storage.skipped.count  # the listing's and the reads': known once the scan is over
    if args.json:
        answer = json_text({"root": storage.url, "heads_read": heads, "entries": [entry_row(e) for e in chosen],
                            "skipped": skipped})
        write_out(answer)
    else:
        table = ls_table.build(chosen, heads=heads, url=storage.url, skipped=skipped)
        write_out(table.render(time.time()))
        answer = table.encode()
    if kept is not None:
        kept.put(answer)
    return EXIT_OK


def stats_json(storage: Storage, s: CacheStats) -> dict[str, Any]:
    """``stats --json`` (stable field names). ``skipped``: objects named like entries that were not read (not
    regular files, names that cannot be read safely; ``doctor`` lists them)."""
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
        "skipped": storage.skipped.count,
    }


def cmd_stats(args: argparse.Namespace, storage: Storage) -> int:
    source = IndexedRoot(storage, use_index=not args.no_index)
    kept = source.kept("stats", ())
    answer = kept.get() if kept is not None else None
    if answer is None:
        answer = json_text(stats_json(storage, summarize(progress(source.records(), "scanning"))))
        if kept is not None:
            kept.put(answer)
    if args.json:
        write_out(answer)
        return EXIT_OK
    data = msgspec.json.decode(answer)
    now = time.time()
    mix = ", ".join(f"{k} {v}" for k, v in sorted(data["compression"].items())) or "-"
    corrupt = data["corrupt"]
    summary = [
        ["root", storage.url],
        ["entries", f"{data['entries']} ({data['with_atime']} with an -atime record)"],
        ["size", format_bytes(data["size_bytes"])],
        ["compile time stored",
         f"{data['compile_seconds']} s (JAX stores whole seconds; most small programs store 0)"],
        ["compression", mix],
        ["corrupt (header check)", f"{corrupt}" + (" - run `jaxcache doctor` for details" if corrupt else "")],
        ["orphaned -atime files", f"{data['orphans']} ({format_bytes(data['orphan_bytes'])})"],
    ]
    if data.get("skipped"):  # .get: an answer kept before this field existed
        summary.append(["skipped", f"{plural(data['skipped'], 'object')} named like entries that are not regular"
                                   " files or whose names cannot be read safely - run `jaxcache doctor` to list them"])
    oldest, newest = data["oldest_created_s"], data["newest_created_s"]
    if oldest is not None and newest is not None:
        summary.append(["oldest / newest entry",
                        f"{format_duration(now - oldest)} / {format_duration(now - newest)} ago"])
    width = max(len(k) for k, _ in summary)
    print("\n".join(f"{k.ljust(width)}  {shown(v)}" for k, v in summary))
    if data["mixed_compression"]:
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
    ls.add_argument("--heads", action=argparse.BooleanOptionalAction, default=None,
                    help="read each entry's head for compile seconds, compression and status (default: on a "
                         "directory, and on gs:// only with --sort compile, since each head is a request there; the "
                         "head index keeps them, so each object's head is read once)")
    ls.add_argument("--no-index", action="store_true", help=INDEX_HELP)
    ls.set_defaults(run=cmd_ls)

    st = sub.add_parser("stats", help="totals for a cache root",
                        description="Entries, bytes, stored compile seconds, compression mix, corrupt entries "
                                    "(from a header check) and orphaned -atime files, with a per-function table.")
    st.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    st.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    st.add_argument("--top", metavar="N", type=non_negative, default=20,
                    help="functions to show in the table (default 20; --json lists all)")
    st.add_argument("--no-index", action="store_true", help=INDEX_HELP)
    st.set_defaults(run=cmd_stats)
