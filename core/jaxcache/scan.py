"""Stream the entries of a cache root: one record per ``-cache`` file, plus orphaned ``-atime`` files.

Nothing here holds a list of everything: memory is flat in the number of entries. How a ``-cache`` file is
paired with its ``-atime`` depends on the backend: a sorted listing (an object store) sees a key's ``-atime`` right
before its ``-cache``; an unsorted one (a directory) looks the sibling up by name instead.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import msgspec

from jaxcache import entry as fmt
from jaxcache.entry import Compression, EntryKind, EntryName, Status
from jaxcache.errors import NotRegularFileError
from jaxcache.parallel import bounded_map
from jaxcache.storage.base import ObjectInfo, Storage, name_problem


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
    version: str | None = None  # the store's version token (storage.ObjectInfo.version)
    atime_ns: int | None = None
    compression: Compression | None = None
    compile_seconds: int | None = None
    status: Status | None = None
    reason: str | None = None

    @property
    def last_used_s(self) -> float:
        """The newest of the ``-atime`` record and the file's own modification time."""
        return last_used_s(self.mtime_s, self.atime_ns)


def last_used_s(mtime_s: float, atime_ns: int | None) -> float:
    """:attr:`Entry.last_used_s` of an entry's two fields (one rule, for records and for columns)."""
    if atime_ns is None:
        return mtime_s
    return max(mtime_s, atime_ns / 1e9)


class Orphan(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """An ``-atime`` file whose ``-cache`` file is gone (JAX's LRU or a prune removed only half)."""

    key: str
    module: str
    name: str
    size_bytes: int
    mtime_s: float
    version: str | None = None


Record = Entry | Orphan


@dataclass(frozen=True, slots=True)
class _Pending:
    info: ObjectInfo
    parsed: EntryName
    has_atime: bool | None  # None: not known from the listing, look it up


def scan(storage: Storage, *, read_headers: bool = True, workers: int | None = None) -> Iterator[Record]:
    """Yield an :class:`Entry` per ``-cache`` file and an :class:`Orphan` per lone ``-atime`` file.

    Skips ``.jaxcache/``, ``.lockfile``, XLA sub-caches and anything else JAX did not name. With
    ``read_headers`` each entry's compression and stored compile seconds are read (a few hundred bytes
    for most entries); an entry whose first bytes do not decode is yielded with status ``corrupt``. Memory stays
    flat; jaxcache.scan_indexed gives the same records reading only what a head index does not hold.

    Objects named like entries that are not regular files (a FIFO, a link, a folder), and names the backend cannot
    read (a backslash), are skipped and counted in ``storage.skipped``: never read, never fatal for the rest.
    """
    if workers is None:
        workers = storage.io_workers
    pairs = _pairs_sorted(storage) if storage.listing_sorted else _pairs_unsorted(storage)
    build = partial(_build, storage, read_headers)
    for record in bounded_map(build, pairs, workers=workers):
        if record is not None:
            yield record


def read_atime(storage: Storage, key: str) -> int | None:
    """A key's ``-atime`` value; None when there is none, it is malformed, or it is not a regular file (skipped)."""
    try:
        raw = storage.read_range(fmt.atime_name(key), 0, fmt.ATIME_BYTES + 1)
    except NotRegularFileError:
        return None  # counted in storage.skipped; the entry itself is still there
    return fmt.decode_atime(raw) if raw is not None else None


def _build(storage: Storage, read_headers: bool, item: _Pending | Orphan) -> Record | None:
    if isinstance(item, Orphan):
        return item
    info, parsed = item.info, item.parsed
    atime_ns = None
    if item.has_atime is not False:
        atime_ns = read_atime(storage, parsed.key)
    compression = seconds = status = reason = None
    if read_headers:
        try:
            header = read_head(storage, info)
        except NotRegularFileError:
            return None  # replaced by a FIFO, a link or a folder since the listing: skipped (and counted)
        compression, seconds, status, reason = (
            header.compression, header.compile_seconds, header.status, header.reason
        )
    return Entry(
        key=parsed.key, module=parsed.module, hash=parsed.hash, name=info.name,
        size_bytes=info.size_bytes, mtime_s=info.mtime_s, version=info.version,
        atime_ns=atime_ns, compression=compression, compile_seconds=seconds, status=status, reason=reason,
    )


def read_head(storage: Storage, info: ObjectInfo) -> fmt.Header:
    """Compression and stored compile seconds of one ``-cache`` object, reading as little as the backend allows."""
    return fmt.read_header(partial(read_or_empty, storage, info.name), info.size_bytes,
                           first_read_bytes=storage.head_first_read(info.size_bytes))


def read_or_empty(storage: Storage, name: str, offset: int, length: int) -> bytes:
    # An entry deleted between listing and reading reads as empty (and so is reported, not crashed on).
    return storage.read_range(name, offset, length) or b""


def _orphan(info: ObjectInfo, parsed: EntryName) -> Orphan:
    return Orphan(parsed.key, parsed.module, info.name, info.size_bytes, info.mtime_s, info.version)


def parse_listed(storage: Storage, name: str) -> EntryName | None:
    """:func:`jaxcache.entry.parse_name` for a listed name; a name like an entry's that the backend cannot read is
    counted in ``storage.skipped`` and gives None."""
    parsed = fmt.parse_name(name)
    if parsed is not None and (why := name_problem(name)) is not None:
        storage.skipped.add(name, why)
        return None
    return parsed


def _pairs_unsorted(storage: Storage) -> Iterator[_Pending | Orphan]:
    for info in storage.iter_objects():
        parsed = parse_listed(storage, info.name)
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
        parsed = parse_listed(storage, info.name)
        if parsed is None:
            continue
        if parsed.kind is EntryKind.ATIME:
            waiting[parsed.key] = (info, parsed)
        else:
            yield _Pending(info, parsed, waiting.pop(parsed.key, None) is not None)
    for info, parsed in waiting.values():
        yield _orphan(info, parsed)
