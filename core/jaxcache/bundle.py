"""Bundles: a job's working set as one archive, to bake a cache into an image or carry it to an air-gapped cluster.

An uncompressed tar (entries are compressed already) whose first member is ``manifest.json`` (schema
``jaxcache.bundle/1``: the job, its fingerprint, where it came from, and each key's sha256 and size), then
``<key>-cache`` and ``<key>-sig`` members. Export (here) leaves out, and says why, what it cannot vouch for;
import (:mod:`jaxcache.bundle_import`) trusts nothing an archive says.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Annotated, Protocol, TypeVar

import msgspec

from jaxcache import records, signing
from jaxcache.display import shown
from jaxcache.entry import Status, cache_name, validate
from jaxcache.errors import InvalidInputError, NotRegularFileError, PathEscapeError
from jaxcache.parallel import bounded_map
from jaxcache.records import Fingerprint
from jaxcache.storage.base import Storage, check_name
from jaxcache.units import plural
from jaxcache.working_set import WorkingSet

T = TypeVar("T")

SCHEMA = "jaxcache.bundle/1"
MANIFEST = "manifest.json"
CACHE_SUFFIX = "-cache"
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_ENTRY_BYTES = 16 * 1024**3  # far above any program's entry; a member claiming more is not one
MAX_KEYS = 1_000_000


class Progress(Protocol):
    """Wraps an iteration to show progress (the CLI's tqdm on a terminal); ``what`` names the work."""

    def __call__(self, items: Iterable[T], what: str) -> Iterator[T]: ...


def quiet(items: Iterable[T], what: str) -> Iterator[T]:
    """No progress shown."""
    return iter(items)


class Item(msgspec.Struct, frozen=True):
    """One key in a bundle: the sha256 and size of its entry's bytes, and whether its ``-sig`` object is there."""

    key: records.Key
    sha256: records.Sha256
    size_bytes: Annotated[int, msgspec.Meta(ge=1, le=MAX_ENTRY_BYTES)]
    signature: bool = False


class LeftOut(msgspec.Struct, frozen=True):
    """A key of the working set that export did not carry, and why."""

    key: records.Key
    why: records.Text


class Manifest(msgspec.Struct, frozen=True, tag_field="schema", tag=SCHEMA):
    """What a bundle holds and where it came from: the archive's first member."""

    job: records.Job
    created_at: records.Seconds
    source: records.Text
    fingerprint: Fingerprint | None
    entries: Annotated[list[Item], msgspec.Meta(max_length=MAX_KEYS)]
    runs: Annotated[list[records.Text], msgspec.Meta(max_length=10_000)] = []
    warmups: Annotated[list[records.Text], msgspec.Meta(max_length=10_000)] = []
    left_out: Annotated[list[LeftOut], msgspec.Meta(max_length=MAX_KEYS)] = []

    def to_json(self) -> bytes:
        """The ``manifest.json`` member's bytes."""
        return msgspec.json.format(msgspec.json.encode(self), indent=1)

    def described(self) -> str:
        """One line: the job, its fingerprint and where the bundle came from."""
        fp = self.fingerprint
        where = "unknown fingerprint" if fp is None else (
            f"jaxlib {fp.jaxlib}, {fp.backend or '?'} backend, {fp.device_count or '?'} x {fp.device_kind or '?'}")
        made = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.created_at))
        # Every field comes from the archive, which whoever made it wrote: nothing in it may hide or reorder text.
        return (f"job '{shown(self.job)}' ({shown(where)}), {plural(len(self.entries), 'entry')}"
                f" from {shown(str(self.source))}, made {made}")


def parse_manifest(data: bytes) -> Manifest:
    """A manifest's bytes, checked; :class:`InvalidInputError` says what is wrong."""
    found: Manifest = records.decode(data, Manifest, "the bundle's manifest", MAX_MANIFEST_BYTES)
    keys = [i.key for i in found.entries]
    if len(set(keys)) != len(keys):
        raise InvalidInputError("the bundle's manifest lists a key twice")
    return found


def member_key(name: str) -> tuple[str, str] | None:
    """``(key, "cache" | "sig")`` for a member named exactly ``<key>-cache`` or ``<key>-sig``; else None."""
    try:
        check_name(name)
    except PathEscapeError:
        return None
    for suffix, kind in ((CACHE_SUFFIX, "cache"), (signing.SIG_SUFFIX, "sig")):
        if name.endswith(suffix):
            try:
                return msgspec.convert(name[: -len(suffix)], records.Key), kind
            except msgspec.ValidationError:
                return None
    return None


def sha256_of(data: bytes) -> str:
    """The digest a bundle records for bytes (an entry's, as stored)."""
    return hashlib.sha256(data).hexdigest()


@dataclass(slots=True)
class _Read:
    key: str
    data: bytes | None = None
    sig: bytes | None = None
    why: str | None = None  # why it is left out


def _read_one(storage: Storage, recorded: dict[str, str], key: str) -> _Read:
    try:
        data = storage.read(cache_name(key))
    except NotRegularFileError:
        return _Read(key, why="not a regular file in the root")
    if data is None:
        return _Read(key, why="gone from the root")
    want = recorded.get(key)
    if want is not None and sha256_of(data) != want:
        return _Read(key, why=f"its bytes differ from the digest {want[:12]}… its writer recorded")
    checked = validate(data)
    if checked.status is not Status.OK:
        return _Read(key, why=f"corrupt: {checked.reason}")
    try:
        sig = signing.read_object(storage, key)
        if sig is not None:
            signing.decode(sig)
    except (NotRegularFileError, InvalidInputError):
        sig = None  # not a signature object: carried without one
    return _Read(key, data, sig)


@dataclass(slots=True)
class Exported:
    """What an export wrote (``path`` None: nothing, every key was left out)."""

    manifest: Manifest
    path: str | None = None
    size_bytes: int = 0
    left_out: list[LeftOut] = field(default_factory=list)


def _add(tar: tarfile.TarFile, name: str, size: int, mtime: float, data: IO[bytes]) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    tar.addfile(info, data)


def export(storage: Storage, working: WorkingSet, out: str, *, progress: Progress = quiet,
           now: float | None = None) -> Exported:
    """Write ``working``'s entries and signatures from ``storage`` to the archive ``out`` (a temporary file beside it,
    renamed when whole). Entries are read in parallel and spooled beside ``out``, since the manifest goes first."""
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise InvalidInputError(f"cannot write {out}: {directory} is not a directory")
    try:
        return _export(storage, working, out, directory, progress, time.time() if now is None else now)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {out}: {exc.strerror or exc}") from None


def _export(storage: Storage, working: WorkingSet, out: str, directory: str, progress: Progress,
            created: float) -> Exported:
    items: list[Item] = []
    left: list[LeftOut] = []
    sig_sizes: dict[str, int] = {}
    with tempfile.TemporaryFile(dir=directory, prefix=".jaxcache-bundle-") as spool:
        work = lambda k: _read_one(storage, working.sha256, k)  # noqa: E731
        for got in progress(bounded_map(work, working.keys, workers=storage.io_workers), "reading entries"):
            if got.data is None:
                left.append(LeftOut(got.key, got.why or "unreadable"))
                continue
            items.append(Item(got.key, sha256_of(got.data), len(got.data), got.sig is not None))
            spool.write(got.data)
            if got.sig is not None:
                sig_sizes[got.key] = spool.write(got.sig)
        manifest = Manifest(job=working.job, created_at=created, source=storage.url, fingerprint=working.fingerprint,
                            entries=items, runs=working.runs, warmups=working.warmups, left_out=left)
        if not items:
            return Exported(manifest, left_out=left)
        spool.seek(0)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(out)}.")
        try:
            with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
                text = manifest.to_json()
                _add(tar, MANIFEST, len(text), created, io.BytesIO(text))
                for item in progress(items, "writing the bundle"):
                    _add(tar, cache_name(item.key), item.size_bytes, created, spool)
                    if item.signature:
                        _add(tar, signing.sig_name(item.key), sig_sizes[item.key], created, spool)
            os.replace(tmp, out)
        except BaseException:
            os.unlink(tmp)
            raise
    return Exported(manifest, out, os.path.getsize(out), left)

