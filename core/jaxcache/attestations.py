"""Writers' digests of the entries they wrote, and what each is worth (README, "Integrity", has the threat model).

A digest is only as trustworthy as the channel it came by: ``signed`` (an HMAC with JAXCACHE_ATTEST_KEY, which
only writers hold), ``reported`` (POSTed to the service with a report token) or ``file`` (read from a record in
the bucket, which whoever can write the bucket could also have written, entry and all). For one key the first
digest accepted wins within a tier, a higher tier outranks a lower one, and every other digest is kept as a
conflict: nothing replaces an accepted digest silently, and no record can back-date itself.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from jaxcache import coverage, records
from jaxcache.errors import InvalidInputError, NotRegularFileError
from jaxcache.storage.base import ObjectInfo, Storage

SIGNED, REPORTED, FILE = "signed", "reported", "file"
SOURCES = (SIGNED, REPORTED, FILE)
_TIER = {FILE: 0, REPORTED: 1, SIGNED: 2}
#: The environment variable writers, the service and `doctor --verify` read the signing key from.
KEY_ENV = "JAXCACHE_ATTEST_KEY"


@dataclass(frozen=True, slots=True)
class Attestation:
    """One writer's digest of one entry, and how it reached us."""

    key: str
    sha256: str
    size_bytes: int | None
    writer: str  # "job <job> run <run_id> p<index>" or "warm-up <id>"
    at: float = 0.0  # when it was accepted: the service's clock, or the record object's mtime when read from a file
    source: str = FILE
    record: str | None = None  # the record object it was read from
    platform: str | None = None  # the writer's backend ("cpu", "gpu"): the embedded-name check is pinned on CPU

    @property
    def tier(self) -> int:
        """How much the digest is worth: signed > reported > read from a file."""
        return _TIER[self.source]

    def described(self) -> str:
        """Where the digest came from, for reasons a user reads."""
        if self.source == SIGNED:
            return f"signed by its writer ({self.writer})"
        if self.source == REPORTED:
            return f"reported to the service by its writer ({self.writer})"
        return f"in the record {self.record} ({self.writer})"


@dataclass(slots=True)
class Attested:
    """The digest that counts for each key, and the others seen for it."""

    by_key: dict[str, Attestation] = field(default_factory=dict)
    conflicts: dict[str, list[Attestation]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # record object -> why it was not read (malformed)

    def add(self, att: Attestation) -> None:
        """Fold in one digest, in the order they were accepted."""
        winner, other = prefer(self.by_key.get(att.key), att)
        self.by_key[att.key] = winner
        if other is not None:
            self.conflicts.setdefault(att.key, []).append(other)


def prefer(old: Attestation | None, new: Attestation) -> tuple[Attestation, Attestation | None]:
    """``(the digest that counts, a conflicting one or None)`` when ``new`` arrives after ``old``."""
    if old is None:
        return new, None
    if old.sha256 == new.sha256:
        return (new if new.tier > old.tier else old), None
    return (new, old) if new.tier > old.tier else (old, new)


def key_from_env() -> bytes | None:
    """The signing key from JAXCACHE_ATTEST_KEY, or None."""
    text = os.environ.get(KEY_ENV, "")
    return text.encode() if text else None


def sign(secret: bytes, key: str, sha256: str) -> str:
    """The signature a writer holding ``secret`` gives its digest of ``key``'s entry."""
    return hmac.new(secret, f"jaxcache-attest/1\0{key}\0{sha256}".encode(), hashlib.sha256).hexdigest()


def _source(secret: bytes | None, key: str, sha256: str, signature: str | None, unsigned: str) -> str:
    if secret is not None and signature is not None and hmac.compare_digest(sign(secret, key, sha256), signature):
        return SIGNED
    return unsigned


def from_run(run: records.RunRecord, *, source: str, at: float, secret: bytes | None = None,
             record: str | None = None) -> list[Attestation]:
    """The digests a run record carries (keys its process wrote and read back); ``source`` unless signed."""
    writer = f"job {run.job} run {run.run_id} p{run.process_index}"
    return [Attestation(u.key, u.sha256, u.size_bytes, writer, at, _source(secret, u.key, u.sha256, u.signature,
                                                                            source), record, run.fingerprint.backend)
            for u in run.keys if u.sha256 and u.event == records.WRITE]


def from_coverage(warm: coverage.WarmupRecord, *, source: str, at: float, secret: bytes | None = None,
                  record: str | None = None) -> list[Attestation]:
    """The digests a warm-up's coverage record carries (programs it wrote)."""
    return [Attestation(p.key, p.sha256, p.size_bytes, f"warm-up {warm.id}", at,
                        _source(secret, p.key, p.sha256, p.signature, source), record, warm.platform)
            for p in warm.programs if p.sha256 and p.status == coverage.WRITTEN]


def load(storage: Storage, *, secret: bytes | None = None) -> Attested:
    """Digests in a root's run and coverage records, oldest record object first (by its modification time, which
    the storage sets, not the record). Malformed records are skipped, and named in ``skipped``."""
    found = Attested()
    runs = [i for i in storage.iter_objects(records.RUNS_PREFIX, recursive=True) if records.is_record_name(i.name)]
    warmups = [i for i in storage.iter_objects(coverage.WARMUPS_PREFIX, recursive=True) if i.name.endswith(".json")]
    for info in sorted(runs + warmups, key=lambda i: (i.mtime_s, i.name)):
        try:
            for att in _from_object(storage, info, secret):
                found.add(att)
        except (InvalidInputError, NotRegularFileError) as exc:  # a bad name (PathEscapeError), a FIFO: not fatal
            found.skipped[info.name] = str(exc)
    return found


def _from_object(storage: Storage, info: ObjectInfo, secret: bytes | None) -> Iterable[Attestation]:
    data = storage.read(info.name)
    if data is None:
        return []
    if records.is_record_name(info.name):
        return from_run(records.parse(data), source=FILE, at=info.mtime_s, secret=secret, record=info.name)
    return from_coverage(coverage.parse(data), source=FILE, at=info.mtime_s, secret=secret, record=info.name)
