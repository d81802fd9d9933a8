"""A rescan's listing, kept in memory and on disk so the next rescan, even after a restart, compares listings instead
of reading every row; valid only while the catalog's fingerprint is unchanged (else a full rescan). In memory they
are this module's, keyed by the Catalog object (one per app, so a new app starts with none) and held weakly: the
catalog holds no feature's state, and ``rescan(catalog, ...)`` needs nothing else handed in."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from jaxcache.service.catalog.database import Catalog, masked
from jaxcache.storage import Storage
from jaxcache.storage.base import Stat

log = logging.getLogger("jaxcache.service")

_VERSION = 2  # 2: versions are tokens (text), no longer GCS generations
#: Larger listings stay on disk only between rescans: in memory they would be most of the service's memory.
IN_MEMORY_MAX = 200_000
_warned: set[str] = set()
_kept: weakref.WeakKeyDictionary[Catalog, dict[str, Snapshot]] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


@dataclass(slots=True)
class Snapshot:
    """A rescan's listing and its foreign names; valid while the cache's fingerprint is ``fingerprint``."""

    fingerprint: tuple
    listing: dict[str, Stat]
    foreign: set[str]
    entries: int  # entries and orphans, as the rescan counted them
    listing_id: str | None = field(default=None)  # the disk copy holding this listing, if written


class _Listing(msgspec.Struct, array_like=True):
    version: int
    listing_id: str
    entries: int
    foreign: list[str]
    listing: dict[str, Stat]


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
        stored = msgspec.msgpack.decode(listing_path.read_bytes(), type=_Listing)
    except (OSError, ValueError, KeyError, TypeError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if stored.version != _VERSION or stored.listing_id != sidecar.get("listing_id"):
        return None
    return Snapshot(fingerprint, stored.listing, set(stored.foreign), stored.entries, stored.listing_id)


def keep(catalog: Catalog, cache: str, storage: Storage, snap: Snapshot, *, listing_changed: bool,
         in_memory_max: int = IN_MEMORY_MAX) -> None:
    """Keep ``snap`` on disk, and in memory unless it is over ``in_memory_max`` and the disk copy was written."""
    paths = _paths(catalog, cache, storage)
    if paths is None:
        kept(catalog)[cache] = snap
        return
    listing_path, sidecar_path = paths
    try:
        listing_path.parent.mkdir(parents=True, exist_ok=True)
        if listing_changed or snap.listing_id is None or not listing_path.exists():
            snap.listing_id = uuid.uuid4().hex
            _write(listing_path, msgspec.msgpack.encode(
                _Listing(_VERSION, snap.listing_id, snap.entries, sorted(snap.foreign), snap.listing)))
        _write(sidecar_path, json.dumps({"version": _VERSION, "fingerprint": list(snap.fingerprint),
                                         "listing_id": snap.listing_id}).encode())
        if len(snap.listing) <= in_memory_max:
            kept(catalog)[cache] = snap
    except OSError as exc:
        kept(catalog)[cache] = snap
        if str(listing_path.parent) not in _warned:
            _warned.add(str(listing_path.parent))
            log.warning("cannot keep rescan snapshots in %s (%s): a restarted service's first rescan reads every "
                        "catalog row instead; set JAXCACHE_STATE_DIR to a writable directory", listing_path.parent,
                        exc.strerror or exc)


def _write(path: Path, data: bytes) -> None:
    # A reader sees the old file or the new one, never half of one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
