"""``jaxcache ls`` and ``jaxcache stats``: a root's entries and their totals, from storage and the head index.

Which figures need an entry's head (its first bytes): compile seconds, compression and the corrupt check. Both
commands decide by one rule (:func:`reads_heads`): they read heads on a directory, where a head costs a local read;
in an object store (gs://, s3://, az://), where each costs a request, only with ``--heads`` (or ``ls --sort
compile``), and each object's once: the head index keeps them. Without heads those figures say "not read", whatever
the index holds, so an answer depends only on the listing and the options. Sizes, ages, names, last use and orphans
come from the listing and the ``-atime`` files.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import heapq
import itertools
import sys
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
from jaxcache.errors import InvalidInputError, StorageError
from jaxcache.scan import Entry, Record
from jaxcache.stats import CacheStats, summarize
from jaxcache.storage import Storage, is_object_store, open_storage, split_root
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
_UNREAD = "not read"
#: Names read of the parent of an object-store root that holds nothing, for the prefixes beside it: one listing page.
_NEARBY_NAMES = 1000
_ONCE = "; each object's head is read once: the head index keeps it"


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
    """Whether ``ls`` or ``stats`` reads entries' heads: ``--heads``/``--no-heads``; else on a directory and not in
    an object store, where each head is a request, unless the output needs every head (``ls --sort compile``)."""
    if args.heads is not None:
        return bool(args.heads)
    return getattr(args, "sort", None) in HEAD_SORTS or not is_object_store(storage.url)


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


def empty_prefix_note(storage: Storage) -> str | None:
    """For a root in an object store that holds no object at all, where a mistyped prefix lists as an empty root
    (an object store has no folders to be missing): a line that says so, with the prefixes beside it that one listing
    page of its parent shows, the likeliest meant first. None for a directory (a missing one is an error already)
    and a root with anything in it."""
    if not is_object_store(storage.url) or next(iter(storage.iter_objects("", recursive=True)), None) is not None:
        return None
    store, bucket, prefix = split_root(storage.url)
    parent, _, name = prefix.rpartition("/")
    above = f"{store.scheme}://{bucket}" + (f"/{parent}" if parent else "")
    note = f"nothing is under {storage.url}/ (no object at all)"
    ask = f"{note}: is the {'prefix' if prefix else 'bucket'} spelled as the jobs spell it?"
    if not prefix:
        return ask
    try:
        names = [i.name for i in itertools.islice(open_storage(above).iter_objects("", recursive=True), _NEARBY_NAMES)]
    except StorageError:  # allowed to list the root's prefix, not its parent's: the note without neighbours
        return ask
    from jaxcache.records import RECORDS_DIR  # here: ls of a root with entries never needs it

    beside = sorted({n.split("/", 1)[0] for n in names if "/" in n} - {RECORDS_DIR})  # that root's own records
    if not beside:
        return f"{ask} No prefix is beside it in {above}"
    meant = difflib.get_close_matches(name, beside, n=1, cutoff=0.6)
    listed = ", ".join(shown(f"{above}/{b}") for b in beside[:5]) + (
        ", ..." if len(beside) > 5 or len(names) == _NEARBY_NAMES else "")
    return (f"{note}: did you mean {shown(f'{above}/{meant[0]}')}? Beside it: {listed}" if meant
            else f"{ask} Beside it: {listed}")


def _say_if_empty(storage: Storage, entries: int, args: argparse.Namespace) -> None:
    """The empty-prefix note on stderr, under a table with no entry (unless a filter chose none); --json's
    ``entries: []`` says it to a program."""
    if entries == 0 and getattr(args, "function", None) is None:
        note = empty_prefix_note(storage)
        if note is not None:
            print(f"jaxcache {args.command}: {note}", file=sys.stderr)


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
            _say_if_empty(storage, len(table.before), args)
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
        _say_if_empty(storage, len(chosen), args)
    if kept is not None:
        kept.put(answer)
    return EXIT_OK


def stats_json(storage: Storage, s: CacheStats, *, heads: bool) -> dict[str, Any]:
    """``stats --json`` (stable field names). ``heads``: whether heads were read; without them the figures that
    need heads (compile seconds, compression, corrupt) are null. ``skipped``: objects named like entries that were
    not read (not regular files, names that cannot be read safely; ``doctor`` lists them)."""
    return {
        "root": storage.url,
        "heads_read": heads,
        "entries": s.entries,
        "size_bytes": s.size_bytes,
        "compile_seconds": s.compile_seconds if heads else None,
        "with_atime": s.with_atime,
        "compression": dict(sorted(s.by_compression.items())) if heads else None,
        "mixed_compression": s.mixed_compression if heads else None,
        "corrupt": s.corrupt if heads else None,
        "orphans": s.orphans,
        "orphan_bytes": s.orphan_bytes,
        "oldest_created_s": s.oldest_mtime_s,
        "newest_created_s": s.newest_mtime_s,
        "by_function": [
            {"function": name, "entries": f.entries, "size_bytes": f.size_bytes,
             "compile_seconds": f.compile_seconds if heads else None}
            for name, f in sorted(s.by_function.items(), key=lambda kv: (-kv[1].size_bytes, kv[0]))
        ],
        "skipped": storage.skipped.count,
    }


def cmd_stats(args: argparse.Namespace, storage: Storage) -> int:
    heads = reads_heads(args, storage)
    source = IndexedRoot(storage, use_index=not args.no_index)
    kept = source.kept("stats", (heads,))
    answer = kept.get() if kept is not None else None
    if answer is None:
        stats = summarize(progress(source.records(read_headers=heads), "scanning"))
        answer = json_text(stats_json(storage, stats, heads=heads))
        if kept is not None:
            kept.put(answer)
    if args.json:
        write_out(answer)
        return EXIT_OK
    data = msgspec.json.decode(answer)
    now = time.time()
    read = data["heads_read"]
    corrupt = data["corrupt"]
    summary = [
        ["root", storage.url],
        ["entries", f"{data['entries']} ({data['with_atime']} with an -atime record)"],
        ["size", format_bytes(data["size_bytes"])],
        ["stored compile s",
         f"{data['compile_seconds']} s (JAX stores whole seconds; most small programs store 0)" if read else _UNREAD],
        ["compression",
         (", ".join(f"{k} {v}" for k, v in sorted(data["compression"].items())) or "-") if read else _UNREAD],
        ["corrupt (header check)",
         f"{corrupt}" + (" - run `jaxcache doctor` for details" if corrupt else "") if read else _UNREAD],
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
    if not read:
        print(f"\n{ls_table.heads_note('compile seconds, the compression mix and corrupt entries')}")
    if data["mixed_compression"]:
        print("\nwarning: both zstd and zlib entries: run `jaxcache doctor` for what that means")
    top = data["by_function"][: args.top]
    if top:
        print(f"\nby function (top {len(top)} of {len(data['by_function'])} by size):")
        rows = [[f["function"], str(f["entries"]), format_bytes(f["size_bytes"]),
                 "-" if f["compile_seconds"] is None else f"{f['compile_seconds']} s"] for f in top]
        print(render(["FUNCTION", "ENTRIES", "SIZE", "STORED COMPILE"], rows, right=frozenset({1, 2, 3})))
    _say_if_empty(storage, data["entries"], args)
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
                         "directory; in an object store (gs://, s3://, az://), where each head is a request, only "
                         f"with --sort compile){_ONCE}")
    ls.add_argument("--no-index", action="store_true", help=INDEX_HELP)
    ls.set_defaults(run=cmd_ls)

    st = sub.add_parser("stats", help="totals for a cache root",
                        description="Entries, bytes, stored compile seconds, compression mix, corrupt entries "
                                    "(from a header check) and orphaned -atime files, with a per-function table. "
                                    "Compile seconds, compression and corrupt entries need each entry's head: in an "
                                    "object store (gs://, s3://, az://) a request each, so there they are read only "
                                    "with --heads, and say 'not read' without.")
    st.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    st.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    st.add_argument("--top", metavar="N", type=non_negative, default=20,
                    help="functions to show in the table (default 20; --json lists all)")
    st.add_argument("--heads", action=argparse.BooleanOptionalAction, default=None,
                    help="read each entry's head for compile seconds, the compression mix and corrupt entries "
                         "(default: on a directory, not in an object store (gs://, s3://, az://), where each head is "
                         f"a request){_ONCE}")
    st.add_argument("--no-index", action="store_true", help=INDEX_HELP)
    st.set_defaults(run=cmd_stats)
