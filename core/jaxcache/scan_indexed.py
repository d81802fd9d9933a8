"""A scan through a head index (jaxcache.head_index): the same records as jaxcache.scan, reading only what is new or
changed since the index was saved, and nothing at all for a root listed exactly as then.

The whole listing is taken first, as tuples (the cheapest form): an entry's -atime file may come before or after it in
a directory's order, and its stamp decides whether the index's value still holds. Memory follows the root's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import NamedTuple

import msgspec

from jaxcache import entry as fmt
from jaxcache.entry import Status
from jaxcache.errors import NotRegularFileError
from jaxcache.head_index import AtimeStamp, HeadIndex, Snapshot, listing_digest
from jaxcache.parallel import bounded_map, forked_chunks, usable_cpus
from jaxcache.scan import Entry, Orphan, Record, read_atime, read_or_empty
from jaxcache.storage.base import Listed, Stat, Storage, name_problem, same_stat

#: The names a scan pairs (every other name under a root is not JAX's entry).
_SUFFIXES = ("-cache", "-atime")
#: Names a listing's check joins at a time (about 100 KB of text).
_CHECK_NAMES = 1024


class _ToRead(msgspec.Struct, gc=False):
    key: str
    module: str
    hash: str
    name: str
    size_bytes: int
    mtime_s: float
    version: str | None
    atime_ns: int | None  # the index's value, where it still holds
    read_atime: bool
    head: Entry | None  # the index's entry, where its head still holds; None: read it (or, without heads, leave it)


def _without_head(e: Entry) -> Entry:
    if e.status is None:
        return e
    return msgspec.structs.replace(e, compression=None, compile_seconds=None, status=None, reason=None)


class Listing:
    """A root's -cache and -atime objects as listed once, and their digest (what says "the same root")."""

    __slots__ = ("_digest", "_names", "_skipped", "objects")

    def __init__(self, objects: list[Listed], skipped: list[Listed]) -> None:
        self.objects = objects
        self._skipped = skipped  # what the listing passed over, as rows of the digest (empty: nothing)
        self._digest: bytes | None = None
        self._names: tuple[bool, bool] | None = None

    @property
    def digest(self) -> bytes:
        # Taken on first use: only a command with a head index compares digests, and encoding and hashing a listing
        # of 100k objects costs a tenth of a second that a plain `prune` would spend for nothing.
        if self._digest is None:
            self._digest = listing_digest([*self.objects, *self._skipped] if self._skipped else self.objects)
        return self._digest

    @property
    def jax_names(self) -> bool:
        """True: every name is one JAX writes (entry.parse_name takes it), as one test of them all says."""
        return self._names_checked()[0]

    @property
    def atimes(self) -> bool:
        """False: no -atime object is listed (JAX's default, without its LRU)."""
        return self._names_checked()[1]

    def _names_checked(self) -> tuple[bool, bool]:
        # On first use, by what pairs the listing: a repeated `ls` answered from what it kept never needs it. A slice
        # of names at a time: the joined text is then a buffer the allocator reuses, not three of 7 MB at 100k
        # entries that the kernel maps page by page (that took half of the check's 0.04 s).
        if self._names is None:
            names = [o[0] for o in self.objects]
            jax_names, atimes = True, False
            for start in range(0, len(names), _CHECK_NAMES):
                part = names[start : start + _CHECK_NAMES]
                joined = "\0".join(part) + "\0"
                jax_names = jax_names and fmt.names_parse(joined, len(part))
                atimes = atimes or "-atime\0" in joined
            self._names = jax_names, atimes
        return self._names


def list_root(storage: Storage) -> Listing:
    """The listing :func:`scan_indexed` compares with its index. Names the backend cannot read (a backslash) are left
    out and counted in ``storage.skipped``, as the backend's listing counts what is not a regular file; what was
    skipped is part of the digest, so an answer kept for this listing says the same about it."""
    objects = storage.list_stats(_SUFFIXES)
    names = "".join([o[0] for o in objects])  # one test of all the names for the common case: none is odd
    if "\\" in names or "\x00" in names or not names.isascii():
        bad = {o[0]: why for o in objects if (why := name_problem(o[0])) is not None}
        for name, why in bad.items():
            storage.skipped.add(name, why)
        objects = [o for o in objects if o[0] not in bad]
    skipped = storage.skipped
    extra: list[Listed] = []
    if skipped.count:
        extra = [("", -1, 0.0, str(skipped.count)), *((name, -1, 0.0, None) for name, _ in skipped.items())]
    return Listing(objects, extra)


class Paired(NamedTuple):
    """A listing as a scan pairs it: each entry with the stamp of its ``-atime`` where one is listed, and the
    ``-atime`` objects whose entry is not listed (orphans). Names JAX did not write are left out."""

    entries: list[Listed]  # -cache objects, in listing order
    atimes: dict[str, Stat]  # key -> (size, mtime, version) of its listed -atime
    orphans: list[Listed]  # lone -atime objects, in listing order


def pair(listed: Listing) -> Paired:
    """Pair :func:`list_root`'s objects (what :func:`scan_indexed` and the columns of a prune plan read). A key,
    function and hash are slices of a name that parses (``name[:-6]``, ``name[:-71]``, ``name[-70:-6]``)."""
    listing = listed.objects
    if not listed.atimes:  # a root without JAX's LRU (its default): every object is an entry
        return Paired(listing if listed.jax_names else _parsing(listing), {}, [])
    caches = [o for o in listing if o[0].endswith("-cache")]
    lone = [o for o in listing if o[0].endswith("-atime")]
    if not listed.jax_names:
        caches, lone = _parsing(caches), _parsing(lone)
    listed_names = {o[0] for o in caches}
    return Paired(caches, {o[0][:-6]: o[1:] for o in lone},
                  [o for o in lone if o[0][:-6] + "-cache" not in listed_names])


def _parsing(objects: list[Listed]) -> list[Listed]:
    """The objects whose names JAX writes (parse_name takes them), looked at one by one."""
    return [o for o in objects if fmt.parse_name(o[0]) is not None]


def scan_indexed(
    storage: Storage, index: HeadIndex | None, *, read_headers: bool = True, workers: int | None = None,
    listed: Listing | None = None,
) -> Iterator[Record]:
    """The records :func:`jaxcache.scan.scan` yields, reading only the objects ``index`` does not hold as they are
    now (``listed``: as a :func:`list_root` just taken lists them); ``index`` is saved once the last record has
    been yielded. Without an index, every head asked for is read; an ``-atime`` file is read only where the
    listing has one (a root without JAX's LRU costs its listing and nothing per entry)."""
    if workers is None:
        workers = storage.io_workers
    if listed is None:
        listed = list_root(storage)
    previous = index.load() if index is not None else None
    if previous is not None and previous.listing_digest == listed.digest and (
            previous.heads_complete or not read_headers):
        # Exactly the objects the index was built from: its entries are this listing's answer.
        yield from previous.entries if read_headers else map(_without_head, previous.entries)
        yield from previous.orphans
        return

    old = index.previous_entries(previous) if index is not None and previous is not None else {}
    paired = pair(listed)
    kept: list[Entry] = []  # what the new index holds (heads that still hold are kept even where not yielded)
    todo: list[_ToRead] = []
    for name, size, mtime, version in paired.entries:
        key = name[:-6]
        before, before_atime = old.get(name, (None, None))
        atime_stamp = paired.atimes.get(key)
        atime_ns, read_atime = None, False
        if atime_stamp is not None:
            if before is not None and before_atime is not None and same_stat(atime_stamp, before_atime):
                atime_ns = before.atime_ns
            else:
                read_atime = True
        head = None
        if before is not None and before.status is not None and same_stat((size, mtime, version), (
                before.size_bytes, before.mtime_s, before.version)):
            head = before
        if read_atime or (read_headers and head is None):
            todo.append(_ToRead(key, name[:-71], name[-70:-6], name, size, mtime, version, atime_ns, read_atime,
                                head))
            continue
        if head is not None and head.mtime_s == mtime and head.atime_ns == atime_ns:
            e = head  # the common case: nothing about it changed
        else:
            e = Entry(key, name[:-71], name[-70:-6], name, size, mtime, version, atime_ns,
                      *((head.compression, head.compile_seconds, head.status, head.reason) if head else ()))
        kept.append(e)
        yield e if read_headers else _without_head(e)
    for read in _read_all(storage, read_headers, todo, workers):
        if read is None:
            continue  # no longer a regular file: skipped (and counted)
        kept.append(read)
        yield read if read_headers else _without_head(read)
    orphans = [Orphan(name[:-6], name[:-71], name, size, mtime, version)
               for name, size, mtime, version in paired.orphans]
    yield from orphans
    if index is None:
        return
    atimes: list[AtimeStamp] = [paired.atimes.get(e.key) for e in kept]
    index.save(Snapshot(
        identity=index.identity, listing_digest=listed.digest, heads_complete=all(e.status is not None for e in kept),
        entries=kept, atime_stamps=msgspec.Raw(msgspec.msgpack.encode(atimes)), orphans=orphans,
    ))


def read_atimes(storage: Storage, paired: Paired, workers: int | None = None) -> dict[str, int | None]:
    """The value of each listed ``-atime`` of ``paired``'s entries by key, read as :func:`scan_indexed` reads them
    (None: malformed, or no longer a regular file)."""
    if not paired.atimes:
        return {}
    todo = [_ToRead(name[:-6], name[:-71], name[-70:-6], name, size, mtime, version, None, True, None)
            for name, size, mtime, version in paired.entries if name[:-6] in paired.atimes]
    read = _read_all(storage, False, todo, storage.io_workers if workers is None else workers)
    return {e.key: e.atime_ns for e in read if e is not None}


#: Heads to read before a directory's scan forks workers: decompressing a head costs tens of microseconds of CPU
#: under the GIL, so threads do not share it (a first `ls` of 100k entries spends seconds there), processes do.
FORK_MIN_READS = 4096
#: More would mostly copy the parent: the listing's reads are also bounded by the disk.
FORK_MAX_WORKERS = 8
_FORK_CHUNK = 1024


def _read_all(storage: Storage, read_headers: bool, todo: list[_ToRead], workers: int) -> Iterator[Entry | None]:
    if workers > 1 or len(todo) < FORK_MIN_READS:  # an object store: many requests in flight, in threads
        yield from bounded_map(partial(_read_missing, storage, read_headers), todo, workers=workers)
        return
    for entries, reads, skipped in forked_chunks(partial(_read_chunk, storage, read_headers), todo,
                                                 chunk=_FORK_CHUNK, workers=min(usable_cpus(), FORK_MAX_WORKERS)):
        storage.reads += reads  # made in a worker: counted here, as a scan in this process counts them
        for name, why in skipped:  # likewise what it skipped
            storage.skipped.add(name, why)
        yield from entries


def _read_chunk(
    storage: Storage, read_headers: bool, items: list[_ToRead]
) -> tuple[list[Entry | None], int, list[tuple[str, str]]]:
    before, skipped_before = storage.reads, len(storage.skipped.reasons)
    entries = [_read_missing(storage, read_headers, item) for item in items]
    return entries, storage.reads - before, list(storage.skipped.reasons.items())[skipped_before:]


def _read_missing(storage: Storage, read_headers: bool, item: _ToRead) -> Entry | None:
    atime_ns = item.atime_ns
    if item.read_atime:
        atime_ns = read_atime(storage, item.key)
    head: tuple[fmt.Compression | None, int | None, Status | None, str | None] = (None, None, None, None)
    if item.head is not None:
        head = item.head.compression, item.head.compile_seconds, item.head.status, item.head.reason
    elif read_headers:
        try:
            h = fmt.read_header(partial(read_or_empty, storage, item.name), item.size_bytes,
                                first_read_bytes=storage.head_first_read(item.size_bytes))
        except NotRegularFileError:
            return None  # replaced by a FIFO, a link or a folder since the listing: skipped (and counted)
        head = h.compression, h.compile_seconds, h.status, h.reason
    return Entry(item.key, item.module, item.hash, item.name, item.size_bytes, item.mtime_s, item.version,
                 atime_ns, *head)
