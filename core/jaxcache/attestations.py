"""Writers' digests of the entries they wrote, and what each is worth (docs/threat-model.md).

Only a ``signed`` digest proves anything: one whose ``<key>-sig`` signature verifies against a trusted public key
(jaxcache.signing), read beside the entry when it is judged. ``reported`` (POSTed with a report token) and ``file``
(read from a record in the bucket) digests are unsigned and worth the same: for one key the first accepted counts,
whatever its channel, and every other is kept as a conflict; nothing replaces an accepted digest silently, and no
record can back-date itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from jaxcache import coverage, records
from jaxcache.errors import InvalidInputError, NotRegularFileError
from jaxcache.signing import Signature
from jaxcache.storage.base import ObjectInfo, Storage

SIGNED, REPORTED, FILE = "signed", "reported", "file"
SOURCES = (SIGNED, REPORTED, FILE)


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
    signer: str | None = None  # the trusted key whose signature was verified just now; None: unsigned, proves nothing

    @property
    def proof(self) -> bool:
        """True for a digest a trusted key signed (checked when the entry is judged, never taken from a catalog)."""
        return self.signer is not None

    def described(self) -> str:
        """Where the digest came from, for reasons a user reads."""
        if self.signer is not None:
            return f"signed by the trusted key {self.signer!r} ({self.writer})"
        if self.source == SIGNED:  # a catalog row from the retired HMAC scheme: unverifiable now
            return f"signed with the retired shared key by {self.writer} (not proof)"
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
    """``(the digest that counts, a conflicting one or None)`` when unsigned ``new`` arrives after ``old``: the
    first counts, whatever channel either came by (a report token and bucket write access prove nothing)."""
    if old is None:
        return new, None
    if old.sha256 == new.sha256:
        return old, None
    return old, new


def from_signature(sig: Signature, platform: str | None = None) -> Attestation:
    """A digest a trusted key signed (``sig`` already verified by jaxcache.signing.TrustedKeys.check)."""
    return Attestation(sig.key, sig.sha256, sig.size_bytes, sig.writer or "writer not named", sig.at or 0.0, SIGNED,
                       None, platform, sig.signer)


def from_run(run: records.RunRecord, *, source: str, at: float, record: str | None = None) -> list[Attestation]:
    """The digests a run record carries (keys its process wrote), unsigned: ``source`` says how they came."""
    writer = f"job {run.job} run {run.run_id} p{run.process_index}"
    return [Attestation(u.key, u.sha256, u.size_bytes, writer, at, source, record, run.fingerprint.backend)
            for u in run.keys if u.sha256 and u.event == records.WRITE]


def from_coverage(warm: coverage.WarmupRecord, *, source: str, at: float,
                  record: str | None = None) -> list[Attestation]:
    """The digests a warm-up's coverage record carries (programs it wrote), unsigned."""
    return [Attestation(p.key, p.sha256, p.size_bytes, f"warm-up {warm.id}", at, source, record, warm.platform)
            for p in warm.programs if p.sha256 and p.status == coverage.WRITTEN]


def load(storage: Storage) -> Attested:
    """Digests in a root's run and coverage records, oldest record object first (by its modification time, which
    the storage sets, not the record). Malformed records (larger than their kind's bound too, which is never read
    past) are skipped, and named in ``skipped``."""
    found = Attested()
    runs = [i for i in storage.iter_objects(records.RUNS_PREFIX, recursive=True) if records.is_record_name(i.name)]
    warmups = [i for i in storage.iter_objects(coverage.WARMUPS_PREFIX, recursive=True) if i.name.endswith(".json")]
    for info in sorted(runs + warmups, key=lambda i: (i.mtime_s, i.name)):
        try:
            for att in _from_object(storage, info):
                found.add(att)
        except (InvalidInputError, NotRegularFileError) as exc:  # a bad name (PathEscapeError), a FIFO: not fatal
            found.skipped[info.name] = str(exc)
    return found


def _from_object(storage: Storage, info: ObjectInfo) -> Iterable[Attestation]:
    run = records.is_record_name(info.name)
    data = storage.read_bounded(info.name, records.MAX_RECORD_BYTES if run else coverage.MAX_COVERAGE_BYTES,
                                listed_bytes=info.size_bytes)  # a larger one raises TooLargeError: skipped
    if data is None:
        return []
    if run:
        return from_run(records.parse(data), source=FILE, at=info.mtime_s, record=info.name)
    return from_coverage(coverage.parse(data), source=FILE, at=info.mtime_s, record=info.name)
