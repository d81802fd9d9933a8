"""``jaxcache bundle import``: a bundle's entries added to a root, create-only, trusting nothing the archive says.

The whole archive is checked before anything is written: its structure (the manifest first, then only regular
members named ``<key>-cache`` or ``<key>-sig`` that it lists, none cut short), and each entry's bytes (its
manifest digest and size, whole decompression, and with trusted keys a signature by one of them). A refused entry
is left out with why; a refused archive writes nothing. Each member is checked again as it is written.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from jaxcache import signing
from jaxcache.bundle import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Manifest,
    Progress,
    member_key,
    parse_manifest,
    quiet,
    sha256_of,
)
from jaxcache.entry import Status, cache_name, validate
from jaxcache.errors import InvalidInputError, NotRegularFileError, PreconditionFailedError
from jaxcache.parallel import bounded_map
from jaxcache.storage.base import Storage
from jaxcache.storage.named import open_named

SIGNATURES, DIGESTS = "signatures", "digests"
DIGESTS_ONLY = "checked against the manifest's digests only: proves the archive is whole, not who made it"
_CREATED, _SAME, _DIFFERS = "created", "same", "differs"


class BundleRefusedError(InvalidInputError):
    """The archive as a whole is not a bundle jaxcache will read from (one line says why); nothing was written."""


@dataclass(frozen=True, slots=True)
class _Member:
    offset: int
    size: int


@dataclass(slots=True)
class _Accepted:
    key: str
    entry: _Member
    sha256: str
    sig: bytes | None  # the -sig member's bytes, when it signs exactly these


@dataclass(slots=True)
class Imported:
    """What an import did, key by key, and which check it made."""

    manifest: Manifest
    check: str  # SIGNATURES or DIGESTS
    trusted: list[str]  # the trusted keys' names (signatures)
    imported: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)  # identical bytes were already there
    kept: dict[str, str] = field(default_factory=dict)  # other bytes are there: left alone (key -> why)
    refused: dict[str, str] = field(default_factory=dict)  # failed a check (key -> why)
    #: Entries in the root now whose ``-sig`` could not be placed: another signature object is there (key -> why).
    signatures_kept: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        """True when every entry of the bundle is in the root now, as the bundle has it, with its signature."""
        return not self.kept and not self.refused and not self.signatures_kept

    def check_text(self) -> str:
        """Which check was made, in words."""
        if self.check == SIGNATURES:
            return (f"checked against {signing.TRUSTED_KEYS_ENV} ({', '.join(self.trusted)}): an entry is imported"
                    " only with a signature by one of them over its bytes")
        return f"{DIGESTS_ONLY} (set {signing.TRUSTED_KEYS_ENV} to check signatures)"

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` answer."""
        return {"job": self.manifest.job, "source": self.manifest.source, "check": self.check,
                "trusted_keys": self.trusted, "imported": self.imported, "present": self.present,
                "kept": [{"key": k, "why": w} for k, w in self.kept.items()],
                "refused": [{"key": k, "why": w} for k, w in self.refused.items()],
                "signatures_left_alone": [{"key": k, "why": w} for k, w in self.signatures_kept.items()],
                "notes": self.notes}


def _refuse(path: str, why: str) -> BundleRefusedError:
    return BundleRefusedError(f"{path}: {why}; nothing was imported")


def _structure(path: str, fd: int, size: int) -> tuple[Manifest, dict[str, _Member], dict[str, _Member]]:
    """The manifest and where each listed member's bytes are in the archive open at ``fd``, reading no entry."""
    entries: dict[str, _Member] = {}
    sigs: dict[str, _Member] = {}
    manifest: Manifest | None = None
    try:
        with open(os.dup(fd), "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
            for info in tar:
                if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or info.issparse():
                    raise _refuse(path, f"member {info.name!r} is not a regular file (a link, folder or device)")
                if info.offset_data + info.size > size:
                    raise _refuse(path, f"member {info.name!r} is cut short: the archive is truncated")
                if manifest is None:
                    if info.name != MANIFEST or info.size > MAX_MANIFEST_BYTES:
                        raise _refuse(path, f"its first member is {info.name!r}, not a {MANIFEST} of a jaxcache"
                                            " bundle")
                    data = tar.extractfile(info)
                    assert data is not None
                    manifest = parse_manifest(data.read())
                    listed = {i.key: i for i in manifest.entries}
                    continue
                found = member_key(info.name)
                item = listed.get(found[0]) if found is not None else None
                if found is None or item is None or (found[1] == "sig" and not item.signature):
                    raise _refuse(path, f"member {info.name!r} is not one the manifest lists")
                place = entries if found[1] == "cache" else sigs
                if found[0] in place:
                    raise _refuse(path, f"member {info.name!r} is there twice")
                if found[1] == "sig" and info.size > signing.MAX_SIG_BYTES:
                    raise _refuse(path, f"member {info.name!r} is too large for a signature object")
                place[found[0]] = _Member(info.offset_data, info.size)
    except tarfile.TarError as exc:
        raise _refuse(path, f"not a whole uncompressed tar archive ({exc})") from None
    except OSError as exc:
        raise InvalidInputError(f"cannot read the bundle {path}: {exc.strerror}") from None
    except InvalidInputError as exc:
        if isinstance(exc, BundleRefusedError):
            raise
        raise _refuse(path, str(exc)) from None
    if manifest is None:
        raise _refuse(path, "the archive is empty")
    missing = [i.key for i in manifest.entries if i.key not in entries or (i.signature and i.key not in sigs)]
    if missing:
        raise _refuse(path, f"the archive ends before {missing[0]} (and {len(missing) - 1} more) the manifest lists:"
                            " truncated")
    return manifest, entries, sigs


def _pread(fd: int, member: _Member) -> bytes:
    data = os.pread(fd, member.size, member.offset)
    if len(data) != member.size:
        raise BundleRefusedError("the archive changed while it was read: nothing more was imported")
    return data


def _judge(data: bytes, sig: bytes | None, key: str, sha: str, size: int, trusted: signing.TrustedKeys) -> str | None:
    """Why an entry's bytes are refused, or None."""
    if trusted:
        why = signing.found_in(sig, key, trusted).judge(data)
        if why is not None:
            return why
    if len(data) != size or sha256_of(data) != sha:
        return "its bytes differ from the manifest's digest"
    checked = validate(data)
    return None if checked.status is Status.OK else f"corrupt: {checked.reason}"


def _signs(sig: bytes | None, key: str, sha: str, size: int) -> bool:
    """True when a ``-sig`` object's bytes hold a signature naming exactly this entry."""
    try:
        return sig is not None and any(s.key == key and s.sha256 == sha and s.size_bytes == size
                                       for s in signing.decode(sig))
    except InvalidInputError:
        return False


@dataclass(slots=True)
class Checked:
    """A whole archive checked (:func:`check_archive`): the refused entries named, the rest ready to add."""

    path: str
    result: Imported
    accepted: list[_Accepted]


def check_archive(path: str, trusted: signing.TrustedKeys, *, progress: Progress = quiet) -> Checked:
    """Check the whole archive, writing nothing: what would be imported, and each refused entry with why.
    :class:`BundleRefusedError` when the archive as a whole is refused."""
    fd = open_named(path, "the bundle")  # judged as named; a FIFO or a device is refused, never waited on
    try:
        manifest, entries, sigs = _structure(path, fd, os.fstat(fd).st_size)
        done = Imported(manifest, SIGNATURES if trusted else DIGESTS, sorted(trusted.keys))
        accepted: list[_Accepted] = []
        for item in progress(manifest.entries, "checking entries"):
            member = entries[item.key]
            if member.size != item.size_bytes:
                done.refused[item.key] = f"{member.size} bytes, where the manifest says {item.size_bytes}"
                continue
            data = _pread(fd, member)
            sig = _pread(fd, sigs[item.key]) if item.key in sigs else None
            why = _judge(data, sig, item.key, item.sha256, item.size_bytes, trusted)
            if why is not None:
                done.refused[item.key] = why
                continue
            if sig is not None and not _signs(sig, item.key, item.sha256, item.size_bytes):
                done.notes.append(f"{signing.sig_name(item.key)} signs other bytes: not imported")
                sig = None
            accepted.append(_Accepted(item.key, member, item.sha256, sig))
    finally:
        os.close(fd)
    return Checked(path, done, accepted)


def _create(storage: Storage, name: str, data: bytes) -> str:
    """Write ``name`` create-only: created, the same bytes already there, or other bytes there (left alone)."""
    info = storage.stat(name)
    if info is None:
        try:
            storage.write_atomic(name, data, create_only=True)
            return _CREATED
        except PreconditionFailedError:
            pass  # written meanwhile: compared below
    elif info.size_bytes != len(data):
        return _DIFFERS
    try:
        there = storage.read(name)
    except NotRegularFileError:
        return _DIFFERS
    return _SAME if there == data else _DIFFERS


def _read_accepted(fd: int, checked: _Accepted) -> bytes:
    """An accepted entry's bytes, read again and checked against the digest that passed (the file may have changed
    since it was checked)."""
    data = _pread(fd, checked.entry)
    if sha256_of(data) != checked.sha256:
        raise BundleRefusedError("the archive changed while it was imported: nothing more was imported")
    return data


def accepted_entries(checked: Checked) -> Iterator[tuple[str, bytes, str, bytes | None]]:
    """What passed :func:`check_archive`, in the archive's order: each key with its entry's bytes (read again and
    checked against the digest that passed), their sha256 and the ``-sig`` member's bytes when it signs exactly
    them. Reads one entry at a time (a node-local tier seeds itself from a pack this way)."""
    fd = open_named(checked.path, "the bundle")
    try:
        for accepted in checked.accepted:
            yield accepted.key, _read_accepted(fd, accepted), accepted.sha256, accepted.sig
    finally:
        os.close(fd)


def _put(storage: Storage, fd: int, checked: _Accepted) -> tuple[str, str | None]:
    data = _read_accepted(fd, checked)
    entry = _create(storage, cache_name(checked.key), data)
    if entry == _DIFFERS:
        return _DIFFERS, "the root holds other bytes under this key: left as they are"
    if checked.sig is not None and _create(storage, signing.sig_name(checked.key), checked.sig) == _DIFFERS:
        return entry, f"the root holds another {signing.sig_name(checked.key)}: left as it is, this bundle's not placed"
    return entry, None


def add_checked(checked: Checked, storage: Storage, *, progress: Progress = quiet) -> Imported:
    """Add what passed :func:`check_archive` to ``storage``, create-only (an entry, then its ``-sig``), in parallel;
    each member's bytes are checked again as they are read."""
    done = checked.result
    fd = open_named(checked.path, "the bundle")
    try:
        work = lambda c: _put(storage, fd, c)  # noqa: E731
        outcomes = bounded_map(work, checked.accepted, workers=storage.io_workers)
        for accepted, (outcome, why) in zip(checked.accepted, progress(outcomes, "importing"), strict=True):
            if outcome == _DIFFERS:
                done.kept[accepted.key] = why or ""
                continue
            (done.imported if outcome == _CREATED else done.present).append(accepted.key)
            if why is not None:  # the entry is there, its signature is not: a signed job would skip it
                done.signatures_kept[accepted.key] = why
    finally:
        os.close(fd)
    return done


def import_bundle(path: str, storage: Storage, trusted: signing.TrustedKeys, *,
                  progress: Progress = quiet) -> Imported:
    """Check ``path`` whole, then add what passed to ``storage``. A refused archive raises
    :class:`BundleRefusedError` before any write."""
    return add_checked(check_archive(path, trusted, progress=progress), storage, progress=progress)
