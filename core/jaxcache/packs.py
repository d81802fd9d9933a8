"""Packs: a release's working set published into the root as one object, so that a fleet's nodes read it in a few
large ranged reads instead of one request per entry each.

A pack is a bundle (:mod:`jaxcache.bundle`, schema ``jaxcache.bundle/1``) stored whole at
``<root>/.jaxcache/packs/<name>.tar`` (the name percent-encoded; a job's name rule), create-or-replace: publishing
under a name again is a new release, which the object's version names (GCS's generation, the ETag on S3 and Azure;
size and modification time on a directory). ``jaxcache bundle export --pack`` and ``warmup --pack`` publish one. A
node reads one with :func:`download` (bounded parallel ranged reads into a local file) and checks it as ``bundle
import`` checks an archive (:func:`jaxcache.bundle_import.check_archive`) before any of it is used.
"""

from __future__ import annotations

import os
import tempfile
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jaxcache import records
from jaxcache.errors import InvalidInputError, StorageError
from jaxcache.parallel import bounded_map
from jaxcache.storage.base import ObjectInfo, Storage

if TYPE_CHECKING:  # the bundle's code comes with a pack's reading or writing: a job that names none never loads it
    from jaxcache.bundle import Exported, Progress
    from jaxcache.working_set import WorkingSet

PACKS_PREFIX = f"{records.RECORDS_DIR}/packs/"
SUFFIX = ".tar"
#: One ranged read: large enough that a pack of a few GB is a few hundred requests, small enough that one read
#: finishes well within a lookup's deadline on a slow link (S3 advises 8-16 MB ranges).
CHUNK_BYTES = 8 * 1024 * 1024


class PackChangedError(StorageError):
    """The pack was replaced or removed while it was read: the bytes read are not one object's."""


def check_name(name: str) -> str:
    """A pack's name follows a job's name rule: 1-200 printable characters without ``/`` or ``\\``."""
    try:
        return records.check_job(name)
    except InvalidInputError:
        raise InvalidInputError(f"pack name {name!r}: use 1-200 printable characters without '/' or '\\'") from None


def object_name(name: str) -> str:
    """The pack's object under the root: ``.jaxcache/packs/<name percent-encoded>.tar``."""
    return f"{PACKS_PREFIX}{urllib.parse.quote(check_name(name), safe='')}{SUFFIX}"


@dataclass(slots=True)
class Published:
    """What :func:`publish_set` did: the archive written (``exported``) and, when it held anything, the pack object
    as stored (``info``: its size and version)."""

    name: str
    exported: Exported
    info: ObjectInfo | None = None


def publish(storage: Storage, name: str, path: str) -> ObjectInfo:
    """Store the archive at ``path`` as the pack ``name``, whole, replacing any pack of that name; the object as it is
    now (one stat after the write). The archive is sent in one request, so it is held in memory meanwhile."""
    target = object_name(name)
    with open(path, "rb") as f:
        storage.write_atomic(target, f.read())
    info = storage.stat(target)
    if info is None:
        raise StorageError(f"{target} in {storage.url} is not there right after it was written")
    return info


def publish_set(storage: Storage, working: WorkingSet, name: str, *, progress: Progress | None = None) -> Published:
    """Export ``working`` from ``storage`` as a bundle (as ``jaxcache bundle export`` does, into a temporary
    directory) and publish it as the pack ``name``; nothing is published when no entry could be exported."""
    from jaxcache.bundle import export, quiet

    object_name(name)  # a bad name is refused before anything is read
    with tempfile.TemporaryDirectory(prefix="jaxcache-pack-") as tmp:
        exported = export(storage, working, os.path.join(tmp, "pack.tar"), progress=progress or quiet)
        if exported.path is None:
            return Published(name, exported)
        return Published(name, exported, publish(storage, name, exported.path))


def head_keys(head: bytes) -> frozenset[str] | None:
    """The keys the manifest at the start of a pack lists, read from its first ``head`` bytes; None when the manifest
    is not whole in them or they are not a bundle's start. Unchecked: only for knowing early which keys a pack
    brings (the archive is checked whole before anything of it is used)."""
    import io
    import tarfile

    from jaxcache.bundle import MANIFEST, parse_manifest

    try:
        with tarfile.open(fileobj=io.BytesIO(head), mode="r:") as tar:
            info = tar.next()
            if info is None or info.name != MANIFEST or info.offset_data + info.size > len(head):
                return None
            data = head[info.offset_data: info.offset_data + info.size]
        return frozenset(i.key for i in parse_manifest(data).entries)
    except (tarfile.TarError, InvalidInputError, OSError):
        return None


def download(read: Callable[[int, int], bytes | None], size_bytes: int, fd: int, *, workers: int,
             chunk_bytes: int = CHUNK_BYTES, first: Callable[[bytes], None] | None = None,
             done: Callable[[int], None] | None = None) -> None:
    """Read a pack of ``size_bytes`` into the file open at ``fd`` with ranged reads (``read(offset, length)``, the
    store's ``read_range`` as the caller bounds it) of ``chunk_bytes``, ``workers`` at once. The first range comes
    alone, handed to ``first`` (the manifest is there: :func:`head_keys`), then the rest in parallel; ``done`` is
    told the bytes of each range written. Raises :class:`PackChangedError` when a range is missing or short: the
    object was replaced or removed meanwhile."""

    def one(offset: int) -> int:
        want = min(chunk_bytes, size_bytes - offset)
        data = read(offset, want)
        if data is None or len(data) != want:
            raise PackChangedError("the pack was replaced or removed while it was read")
        os.pwrite(fd, data, offset)
        if offset == 0 and first is not None:
            first(data)
        if done is not None:
            done(want)
        return want

    if size_bytes <= 0:
        raise PackChangedError("the pack is empty")
    one(0)
    for _ in bounded_map(one, range(chunk_bytes, size_bytes, chunk_bytes), workers=workers):
        pass
