"""Integrity: tell a good entry from a tampered, swapped, torn or unattested one before a job loads it.

JAX executes what it loads, zstd entries carry no checksum, and an entry's bytes copied under another key load
silently and compute the wrong thing (docs/jax-internals.md). Two independent checks catch that:

- a digest recorded by the process that wrote the entry (the client's run records, warm-up's coverage records):
  any later change to the bytes is ``tampered``;
- the module name JAX serializes inside the executable, which must equal the one in the file name: bytes moved
  between keys of different functions are ``mismatched``, even with no record at all.

Reading that name needs no JAX: the serialized executable starts with a length-delimited protobuf header whose
field 7 is the module name (pinned by tests against JAX 0.10 and 0.12 entries).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial

from jaxcache import coverage, records
from jaxcache.entry import TIME_HEADER_BYTES, Status, validate
from jaxcache.errors import InvalidInputError
from jaxcache.parallel import bounded_map
from jaxcache.scan import Entry
from jaxcache.storage.base import Storage

OK = "ok"
TAMPERED = "tampered"
MISMATCHED = "mismatched"
CORRUPT = "corrupt"
PENDING = "pending"
UNATTESTED = "unattested"
# Most severe first: an entry's class is the first that applies; every applying one is listed.
CLASSES = (TAMPERED, MISMATCHED, CORRUPT, PENDING, UNATTESTED, OK)
BAD_CLASSES = (TAMPERED, MISMATCHED, CORRUPT)
_MODULE_FIELD = 7


@dataclass(frozen=True, slots=True)
class Attestation:
    """What the writer of an entry recorded about it."""

    key: str
    sha256: str
    size_bytes: int | None
    writer: str  # "job <job> run <run_id>" or "warm-up <id>"
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """One entry's integrity."""

    key: str
    name: str
    classification: str
    classes: tuple[str, ...]
    reasons: tuple[str, ...]
    sha256: str | None
    size_bytes: int
    embedded_module: str | None
    attested_by: str | None = None


def sha256_hex(data: bytes) -> str:
    """The digest recorded for an entry's stored (compressed) bytes."""
    return hashlib.sha256(data).hexdigest()


def embedded_module(head: bytes) -> str | None:
    """The module name inside a decompressed entry's serialized executable; None when it cannot be read."""
    body = head[TIME_HEADER_BYTES:]
    try:
        length, i = _varint(body, 0)
        header = body[i : i + length]
        if len(header) < length:
            return None
        for number, value in _fields(header):
            if number == _MODULE_FIELD and isinstance(value, bytes):
                return value.decode("utf-8")
    except (IndexError, ValueError, UnicodeDecodeError):
        return None
    return None


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i
        if shift > 63:
            raise ValueError("varint too long")


def _fields(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    i = 0
    while i < len(message):
        tag, i = _varint(message, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _varint(message, i)
            yield number, value
        elif wire == 2:
            length, i = _varint(message, i)
            yield number, message[i : i + length]
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def classify(entry: Entry, data: bytes, attestation: Attestation | None, *, now: float, min_age_s: float) -> Verdict:
    """Judge one entry's bytes. Entries younger than ``min_age_s`` that look broken are ``pending``, never
    corrupt or tampered: JAX writes non-atomically, so a file being written looks truncated."""
    classes: list[str] = []
    reasons: list[str] = []
    digest = sha256_hex(data)
    validation = validate(data)
    module = embedded_module(validation.head) if validation.status is Status.OK else None
    if attestation is not None and attestation.sha256 != digest:
        classes.append(TAMPERED)
        reasons.append(f"digest {digest[:12]}… differs from the {attestation.sha256[:12]}… recorded by its writer"
                       f" ({attestation.writer})")
    if module is not None and module != entry.module:
        classes.append(MISMATCHED)
        reasons.append(f"the executable inside is {module!r}, but the file name says {entry.module!r}: bytes of"
                       " another program")
    if validation.status is not Status.OK:
        classes.append(CORRUPT)
        reasons.append(validation.reason or "does not decompress")
    young = now - entry.mtime_s < min_age_s
    if young and classes and MISMATCHED not in classes:
        classes = [PENDING]
        reasons = [f"written {max(now - entry.mtime_s, 0):.0f} s ago (grace {min_age_s:.0f} s): may still be"
                   f" being written; {'; '.join(reasons)}"]
    if not classes:
        classes.append(OK if attestation is not None else UNATTESTED)
        if attestation is None:
            reasons.append("no writer recorded a digest (written by plain JAX, or before jaxcache)")
    ordered = tuple(c for c in CLASSES if c in classes)
    return Verdict(
        key=entry.key, name=entry.name, classification=ordered[0], classes=ordered, reasons=tuple(reasons),
        sha256=digest, size_bytes=len(data), embedded_module=module,
        attested_by=attestation.writer if attestation is not None else None,
    )


def load_attestations(storage: Storage) -> dict[str, Attestation]:
    """Digests recorded in a root's run records and warm-up coverage records, first writer per key."""
    found: dict[str, Attestation] = {}

    def keep(att: Attestation) -> None:
        old = found.get(att.key)
        if old is None or att.at < old.at:
            found[att.key] = att

    for info in storage.iter_objects(records.RUNS_PREFIX, recursive=True):
        if not records.is_record_name(info.name):
            continue
        try:
            run = records.parse(storage.read(info.name) or b"")
        except InvalidInputError:
            continue
        for usage in run.keys:
            if usage.sha256 and usage.event == records.WRITE:
                keep(Attestation(usage.key, usage.sha256, usage.size_bytes, f"job {run.job} run {run.run_id}",
                                 usage.first_at or run.started_at))
    for info in storage.iter_objects(coverage.WARMUPS_PREFIX, recursive=True):
        if not info.name.endswith(".json"):
            continue
        try:
            warm = coverage.parse(storage.read(info.name) or b"")
        except InvalidInputError:
            continue
        for program in warm.programs:
            if program.sha256 and program.status == coverage.WRITTEN:
                keep(Attestation(program.key, program.sha256, program.size_bytes, f"warm-up {warm.id}",
                                 warm.started_at))
    return found


def verify(
    storage: Storage, entries: Iterable[Entry], attestations: dict[str, Attestation], *, now: float,
    min_age_s: float, workers: int | None = None,
) -> Iterator[Verdict]:
    """Read and judge every entry (in parallel, order kept); entries deleted meanwhile are skipped."""
    judge = partial(_judge, storage, attestations, now, min_age_s)
    for verdict in bounded_map(judge, entries, workers=workers or storage.io_workers):
        if verdict is not None:
            yield verdict


def _judge(storage: Storage, attestations: dict[str, Attestation], now: float, min_age_s: float,
           entry: Entry) -> Verdict | None:
    data = storage.read(entry.name)
    if data is None:
        return None
    return classify(entry, data, attestations.get(entry.key), now=now, min_age_s=min_age_s)
