"""A rescan's listing, kept in memory and on disk so the next rescan, even after a restart, compares listings instead
of reading every row; valid only while the catalog's fingerprint is unchanged (else a full rescan). A rescan works on
the listing by key (:class:`Listing`); it is kept by name, as Storage.list_changes compares it. In memory the kept
listings are this module's, keyed by the Catalog object (one per app, so a new app starts with none) and held
weakly: the catalog holds no feature's state, and ``rescan(catalog, ...)`` needs nothing else handed in."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import BinaryIO

import msgspec

from jaxcache.service.catalog.database import Catalog, masked
from jaxcache.storage import Storage
from jaxcache.storage.base import Stat

log = logging.getLogger("jaxcache.service")

_VERSION = 3  # 3: the listing in parts (2: whole; versions are tokens, no longer GCS generations)
#: Larger listings stay on disk only between rescans: in memory they would be most of the service's memory.
IN_MEMORY_MAX = 200_000
#: Names a part of the disk copy holds: what is encoded or decoded at a time (about 200 KB), never the whole listing.
_PART = 1024
_FRAME = struct.Struct("<I")
_SUFFIXES = ("-cache", "-atime")
_warned: set[str] = set()
_kept: weakref.WeakKeyDictionary[Catalog, dict[str, Snapshot]] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


class Listing:
    """A root's listing shaped as the catalog is: each key's ``-cache`` and ``-atime`` stats under one string of the
    key (a name per object would hold its text twice), and every other name as listed, with those a rescan sets
    aside (:meth:`set_aside`: not JAX's, or not indexable). What a rescan builds and compares, not copies of it."""

    __slots__ = ("atimes", "caches", "others")

    def __init__(self) -> None:
        self.caches: dict[str, Stat] = {}  # key -> its -cache object's stat
        self.atimes: dict[str, Stat] = {}  # key -> its -atime object's stat
        self.others: dict[str, Stat] = {}  # name -> stat

    @classmethod
    def of(cls, objects: Iterable[tuple[str, Stat]], *, aside: set[str] | None = None,
           keys: dict[str, str] | None = None) -> Listing:
        """The listing of ``objects`` (name, stat), with the names in ``aside`` set aside as before. ``keys`` maps
        each key to its one string (the catalog's own, where it read them); grown with the listing's."""
        listing = cls()
        caches, atimes, others = listing.caches, listing.atimes, listing.others
        keys = {} if keys is None else keys
        for name, stat in objects:
            if aside and name in aside:
                others[name] = stat
                continue
            if name.endswith("-cache"):
                side = caches
            elif name.endswith("-atime"):
                side = atimes
            else:
                others[name] = stat
                continue
            key = name[:-6]
            side[keys.setdefault(key, key)] = stat
        return listing

    def add(self, name: str, stat: Stat) -> None:
        """``name`` listed anew (new or changed): under its key, to be judged again, even if it was set aside."""
        if self.others:
            self.others.pop(name, None)
        if name.endswith("-cache"):
            self.caches[name[:-6]] = stat
        elif name.endswith("-atime"):
            self.atimes[name[:-6]] = stat
        else:
            self.others[name] = stat

    def discard(self, name: str) -> None:
        """``name`` is no longer listed."""
        self.others.pop(name, None)
        if name.endswith(_SUFFIXES):
            (self.caches if name.endswith("-cache") else self.atimes).pop(name[:-6], None)

    def set_aside(self, side: dict[str, Stat], suffix: str, key: str) -> None:
        """Move ``key``'s object from ``side`` (:attr:`caches` or :attr:`atimes`, whose names end in ``suffix``) to
        the other names."""
        self.others[key + suffix] = side.pop(key)

    def aside(self) -> set[str]:
        """The names set aside that are named like an entry or an -atime: what the next rescan sets aside again."""
        return {name for name in self.others if name.endswith(_SUFFIXES)}

    def by_name(self) -> Iterator[tuple[str, Stat]]:
        """Every (name, stat), as Storage.list_changes lists them; names are made one at a time."""
        for key, stat in self.caches.items():
            yield key + "-cache", stat
        for key, stat in self.atimes.items():
            yield key + "-atime", stat
        yield from self.others.items()

    def __len__(self) -> int:
        return len(self.caches) + len(self.atimes) + len(self.others)


def popped(listing: dict[str, Stat]) -> Iterator[tuple[str, Stat]]:
    """The items of ``listing``, taken out of it one by one, so its names are freed as a :class:`Listing` of them is
    built (rather than both held whole)."""
    while listing:
        yield listing.popitem()
    listing.clear()  # its table too


@dataclass(slots=True)
class Snapshot:
    """A rescan's listing and its foreign names; valid while the cache's fingerprint is ``fingerprint``."""

    fingerprint: tuple
    listing: dict[str, Stat]
    foreign: set[str]
    entries: int  # entries and orphans, as the rescan counted them
    listing_id: str | None = field(default=None)  # the disk copy holding this listing, if written


class _Head(msgspec.Struct, array_like=True):
    """The disk copy's first part; ``names`` names follow in parts of at most :data:`_PART`."""

    version: int
    listing_id: str
    entries: int
    names: int
    foreign: list[str]


_head = msgspec.msgpack.Decoder(_Head)
_part = msgspec.msgpack.Decoder(dict[str, Stat])


def kept(catalog: Catalog) -> dict[str, Snapshot]:
    """The snapshots this process keeps in memory for ``catalog``'s caches, by cache."""
    with _kept_lock:
        return _kept.setdefault(catalog, {})


def _paths(catalog: Catalog, cache: str, storage: Storage) -> tuple[Path, Path] | None:
    if catalog.snapshot_dir is None:
        return None
    ident = hashlib.sha256("\0".join((masked(catalog.url), cache, storage.url)).encode()).hexdigest()[:24]
    base = Path(catalog.snapshot_dir) / f"rescan-{ident}"
    return base.with_suffix(".listing"), base.with_suffix(".json")


def take(catalog: Catalog, cache: str, storage: Storage, fingerprint: tuple) -> Snapshot | None:
    """The snapshot valid for ``fingerprint`` (this process's, else the disk copy), popped."""
    snap = kept(catalog).pop(cache, None)
    if isinstance(snap, Snapshot):
        return snap if snap.fingerprint == fingerprint else None
    paths = _paths(catalog, cache, storage)
    if paths is None:
        return None
    listing_path, sidecar_path = paths
    try:
        sidecar = json.loads(sidecar_path.read_text())
        if sidecar.get("version") != _VERSION or tuple(sidecar["fingerprint"]) != fingerprint:
            return None
        with listing_path.open("rb") as f:
            head = _head.decode(_frame(f))
            if head.version != _VERSION or head.listing_id != sidecar.get("listing_id"):
                return None
            listing: dict[str, Stat] = {}
            while len(listing) < head.names:
                listing.update(_part.decode(_frame(f)))
            if len(listing) != head.names or f.read(1):
                return None
    except (OSError, ValueError, KeyError, TypeError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return Snapshot(fingerprint, listing, set(head.foreign), head.entries, head.listing_id)


def _frame(f: BinaryIO) -> bytes:
    """The next part of a disk copy (its length, then its bytes)."""
    size = f.read(_FRAME.size)
    if len(size) == _FRAME.size:
        (length,) = _FRAME.unpack(size)
        data = f.read(length)
        if len(data) == length:
            return data
    raise ValueError("the kept listing ends early")


def keep(catalog: Catalog, cache: str, storage: Storage, snap: Snapshot, *,
         in_memory_max: int = IN_MEMORY_MAX) -> None:
    """Keep ``snap``, the listing taken for this rescan and found unchanged: its disk copy stands (written anew only
    where there is none), and it stays in memory unless it is over ``in_memory_max`` and on disk."""
    _keep(catalog, cache, storage, snap, None, in_memory_max)


def keep_new(catalog: Catalog, cache: str, storage: Storage, fingerprint: tuple, listing: Listing, entries: int, *,
             in_memory_max: int = IN_MEMORY_MAX) -> None:
    """Keep a rescan's new ``listing``: written to disk part by part from its keys, and held by name in memory only
    when it has at most ``in_memory_max`` objects (or cannot be written)."""
    snap = Snapshot(fingerprint, {}, listing.aside(), entries)
    _keep(catalog, cache, storage, snap, listing, in_memory_max)


def _keep(catalog: Catalog, cache: str, storage: Storage, snap: Snapshot, listing: Listing | None,
          in_memory_max: int) -> None:
    count = len(snap.listing) if listing is None else len(listing)

    def hold() -> None:
        if listing is not None:
            snap.listing = dict(listing.by_name())
        kept(catalog)[cache] = snap

    paths = _paths(catalog, cache, storage)
    if paths is None:
        hold()
        return
    listing_path, sidecar_path = paths
    try:
        listing_path.parent.mkdir(parents=True, exist_ok=True)
        if listing is not None or snap.listing_id is None or not listing_path.exists():
            snap.listing_id = uuid.uuid4().hex
            head = _Head(_VERSION, snap.listing_id, snap.entries, count, sorted(snap.foreign))
            names = snap.listing.items() if listing is None else listing.by_name()
            _write(listing_path, _parts(head, names))
        _write(sidecar_path, lambda f: f.write(json.dumps(
            {"version": _VERSION, "fingerprint": list(snap.fingerprint), "listing_id": snap.listing_id}).encode()))
        if count <= in_memory_max:
            hold()
    except OSError as exc:
        hold()
        if str(listing_path.parent) not in _warned:
            _warned.add(str(listing_path.parent))
            log.warning("cannot keep rescan snapshots in %s (%s): a restarted service's first rescan reads every "
                        "catalog row instead; set JAXCACHE_STATE_DIR to a writable directory", listing_path.parent,
                        exc.strerror or exc)


def _parts(head: _Head, names: Iterable[tuple[str, Stat]]) -> Callable[[BinaryIO], None]:
    """What writes the disk copy: ``head``, then ``names`` a part at a time, each part with its length before it."""

    def write(f: BinaryIO) -> None:
        encode = msgspec.msgpack.Encoder().encode
        items = iter(names)
        data = encode(head)
        while data:
            f.write(_FRAME.pack(len(data)))
            f.write(data)
            part = dict(islice(items, _PART))
            data = encode(part) if part else b""

    return write


def _write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    # A reader sees the old file or the new one, never half of one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
