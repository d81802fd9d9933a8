"""Stream the entries of a cache root: one record per ``-cache`` file, plus orphaned ``-atime`` files.

Nothing here holds a list of everything: memory is flat in the number of entries. How a ``-cache`` file is
paired with its ``-atime`` depends on the backend: a sorted listing (GCS) sees a key's ``-atime`` right
before its ``-cache``; an unsorted one (a directory) looks the sibling up by name instead.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import msgspec

from jaxcache import entry as fmt
from jaxcache.entry import Compression, EntryKind, EntryName, Status
from jaxcache.parallel import bounded_map
from jaxcache.storage.base import ObjectInfo, Storage

if TYPE_CHECKING:
    from jaxcache.head_index import HeadIndex

#: The names a scan pairs (every other name under a root is not JAX's entry).
_SUFFIXES = ("-cache", "-atime")

# Entries and orphans are msgspec Structs, not dataclasses: a listing builds one per file (100k and more), a Struct
# costs a third of a frozen dataclass to build, and the head index (jaxcache.head_index) stores and loads them as they
# are. gc=False: their fields are strings, numbers and enums, which cannot form cycles, so the collector need not track
# them. array_like: msgspec encodes one as an array of its fields in this order (compact rows in the index; changing
# the fields changes the index format, which the index notices by itself).
class Entry(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One compiled program in a cache root."""

    key: str
    module: str
    hash: str
    name: str
    size_bytes: int
    mtime_s: float
    generation: int | None = None
    atime_ns: int | None = None
    compression: Compression | None = None
    compile_seconds: int | None = None
    status: Status | None = None
    reason: str | None = None

    @property
    def last_used_s(self) -> float:
        """The newest of the ``-atime`` record and the file's own modification time."""
        if self.atime_ns is None:
            return self.mtime_s
        return max(self.mtime_s, self.atime_ns / 1e9)


class Orphan(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """An ``-atime`` file whose ``-cache`` file is gone (JAX's LRU or a prune removed only half)."""

    key: str
    module: str
    name: str
    size_bytes: int
    mtime_s: float
    generation: int | None = None


Record = Entry | Orphan


@dataclass(frozen=True, slots=True)
class _Pending:
    info: ObjectInfo
    parsed: EntryName
    has_atime: bool | None  # None: not known from the listing, look it up


def scan(
    storage: Storage, *, read_headers: bool = True, workers: int | None = None, index: HeadIndex | None = None
) -> Iterator[Record]:
    """Yield an :class:`Entry` per ``-cache`` file and an :class:`Orphan` per lone ``-atime`` file.

    Skips ``.jaxcache/``, ``.lockfile``, XLA sub-caches and anything else JAX did not name. With
    ``read_headers`` each entry's compression and stored compile seconds are read (a few hundred bytes
    for most entries); an entry whose first bytes do not decode is yielded with status ``corrupt``.

    With an ``index`` (jaxcache.head_index) only new and changed objects are read, and the index is saved once the
    last record has been yielded; the root's whole listing is then held in memory. Without one, memory stays flat.
    """
    if workers is None:
        workers = storage.io_workers
    if index is not None:
        yield from _scan_indexed(storage, index, read_headers, workers)
        return
    pairs = _pairs_sorted(storage) if storage.listing_sorted else _pairs_unsorted(storage)
    build = partial(_build, storage, read_headers)
    yield from bounded_map(build, pairs, workers=workers)


def _build(storage: Storage, read_headers: bool, item: _Pending | Orphan) -> Record:
    if isinstance(item, Orphan):
        return item
    info, parsed = item.info, item.parsed
    atime_ns = None
    if item.has_atime is not False:
        raw = storage.read_range(fmt.atime_name(parsed.key), 0, fmt.ATIME_BYTES + 1)
        atime_ns = fmt.decode_atime(raw) if raw is not None else None
    compression = seconds = status = reason = None
    if read_headers:
        header = read_head(storage, info)
        compression, seconds, status, reason = (
            header.compression, header.compile_seconds, header.status, header.reason
        )
    return Entry(
        key=parsed.key, module=parsed.module, hash=parsed.hash, name=info.name,
        size_bytes=info.size_bytes, mtime_s=info.mtime_s, generation=info.generation,
        atime_ns=atime_ns, compression=compression, compile_seconds=seconds, status=status, reason=reason,
    )


def read_head(storage: Storage, info: ObjectInfo) -> fmt.Header:
    """Compression and stored compile seconds of one ``-cache`` object, reading as little as the backend allows."""
    return fmt.read_header(
        partial(_read_or_empty, storage, info.name), info.size_bytes, first_read_bytes=storage.head_read_bytes
    )


def _read_or_empty(storage: Storage, name: str, offset: int, length: int) -> bytes:
    # An entry deleted between listing and reading reads as empty (and so is reported, not crashed on).
    return storage.read_range(name, offset, length) or b""


def _orphan(info: ObjectInfo, parsed: EntryName) -> Orphan:
    return Orphan(parsed.key, parsed.module, info.name, info.size_bytes, info.mtime_s, info.generation)


def _pairs_unsorted(storage: Storage) -> Iterator[_Pending | Orphan]:
    for info in storage.iter_objects():
        parsed = fmt.parse_name(info.name)
        if parsed is None:
            continue
        if parsed.kind is EntryKind.CACHE:
            yield _Pending(info, parsed, None)
        elif not storage.exists(fmt.cache_name(parsed.key)):
            yield _orphan(info, parsed)


def _pairs_sorted(storage: Storage) -> Iterator[_Pending | Orphan]:
    # "<key>-atime" sorts right before "<key>-cache"; an -atime still waiting once the listing has moved
    # past its "-cache" name is an orphan. The waiting set holds a handful of names, not the listing.
    waiting: collections.OrderedDict[str, tuple[ObjectInfo, EntryName]] = collections.OrderedDict()
    for info in storage.iter_objects():
        while waiting:
            key = next(iter(waiting))
            if fmt.cache_name(key) >= info.name:
                break
            yield _orphan(*waiting.popitem(last=False)[1])
        parsed = fmt.parse_name(info.name)
        if parsed is None:
            continue
        if parsed.kind is EntryKind.ATIME:
            waiting[parsed.key] = (info, parsed)
        else:
            yield _Pending(info, parsed, waiting.pop(parsed.key, None) is not None)
    for info, parsed in waiting.values():
        yield _orphan(info, parsed)


# --------------------------------------------------------------------------------------------------------------
# With a head index. The whole listing is taken first (as tuples: the cheapest form), since an entry's -atime file
# may come before or after it in a directory's order and its stamp decides whether the index's value still holds.


class _ToRead(msgspec.Struct, gc=False):
    key: str
    module: str
    hash: str
    name: str
    size_bytes: int
    mtime_s: float
    generation: int | None
    atime_ns: int | None  # the index's value, where it still holds
    read_atime: bool
    head: Entry | None  # the index's entry, where its head still holds; None: read it (or, without heads, leave it)


def _same(size: int, mtime: float, generation: int | None, other: tuple[int, float, int | None]) -> bool:
    # A GCS object is the same one while its generation is (its "updated" time also moves with metadata changes);
    # a file, while its size and mtime are (JAX writes each key once; its -atime file is rewritten in place).
    if generation is not None:
        return generation == other[2] and size == other[0]
    return size == other[0] and mtime == other[1]


def _without_head(e: Entry) -> Entry:
    if e.status is None:
        return e
    return msgspec.structs.replace(e, compression=None, compile_seconds=None, status=None, reason=None)


def _scan_indexed(storage: Storage, index: HeadIndex, read_headers: bool, workers: int) -> Iterator[Record]:
    from jaxcache.head_index import Snapshot, listing_digest

    listing = storage.list_stats(_SUFFIXES)
    digest = listing_digest(listing)
    previous = index.load()
    if previous is not None and previous.listing_digest == digest and (previous.heads_complete or not read_headers):
        # Exactly the objects the index was built from: its entries are this listing's answer.
        yield from previous.entries if read_headers else map(_without_head, previous.entries)
        yield from previous.orphans
        return

    old = index.previous_entries(previous) if previous is not None else {}
    stamps = {name: (size, mtime, generation) for name, size, mtime, generation in listing}
    kept: list[Entry] = []  # what the new index holds (heads that still hold are kept even where not yielded)
    todo: list[_ToRead] = []
    orphans: list[Orphan] = []
    for name, size, mtime, generation in listing:
        if name.endswith("-atime"):
            if name[:-6] + "-cache" not in stamps:
                parsed = fmt.parse_name(name)
                if parsed is not None:
                    orphans.append(Orphan(parsed.key, parsed.module, name, size, mtime, generation))
            continue
        before, before_atime = old.get(name, (None, None))
        if before is not None:
            key, module, digest_hex = before.key, before.module, before.hash
        else:
            parsed = fmt.parse_name(name)
            if parsed is None:
                continue
            key, module, digest_hex = parsed.key, parsed.module, parsed.hash
        atime_stamp = stamps.get(key + "-atime")
        atime_ns, read_atime = None, False
        if atime_stamp is not None:
            if before is not None and before_atime is not None and _same(*atime_stamp, before_atime):
                atime_ns = before.atime_ns
            else:
                read_atime = True
        head = None
        if before is not None and before.status is not None and _same(size, mtime, generation, (
                before.size_bytes, before.mtime_s, before.generation)):
            head = before
        if read_atime or (read_headers and head is None):
            todo.append(_ToRead(key, module, digest_hex, name, size, mtime, generation, atime_ns, read_atime, head))
            continue
        if head is not None and head.mtime_s == mtime and head.atime_ns == atime_ns:
            e = head  # the common case: nothing about it changed
        else:
            e = Entry(key, module, digest_hex, name, size, mtime, generation, atime_ns,
                      *((head.compression, head.compile_seconds, head.status, head.reason) if head else ()))
        kept.append(e)
        yield e if read_headers else _without_head(e)
    for e in bounded_map(partial(_read_missing, storage, read_headers), todo, workers=workers):
        kept.append(e)
        yield e if read_headers else _without_head(e)
    yield from orphans
    atimes = [stamps.get(e.key + "-atime") for e in kept]
    index.save(Snapshot(
        identity=index.identity, listing_digest=digest, heads_complete=all(e.status is not None for e in kept),
        entries=kept, atime_stamps=msgspec.Raw(msgspec.msgpack.encode(atimes)), orphans=orphans,
    ))


def _read_missing(storage: Storage, read_headers: bool, item: _ToRead) -> Entry:
    atime_ns = item.atime_ns
    if item.read_atime:
        raw = storage.read_range(fmt.atime_name(item.key), 0, fmt.ATIME_BYTES + 1)
        atime_ns = fmt.decode_atime(raw) if raw is not None else None
    head: tuple[fmt.Compression | None, int | None, Status | None, str | None] = (None, None, None, None)
    if item.head is not None:
        head = item.head.compression, item.head.compile_seconds, item.head.status, item.head.reason
    elif read_headers:
        h = fmt.read_header(partial(_read_or_empty, storage, item.name), item.size_bytes,
                            first_read_bytes=storage.head_read_bytes)
        head = h.compression, h.compile_seconds, h.status, h.reason
    return Entry(item.key, item.module, item.hash, item.name, item.size_bytes, item.mtime_s, item.generation,
                 atime_ns, *head)
