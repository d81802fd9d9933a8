"""Integrity: tell a good entry from a tampered, swapped, torn or unattested one before a job loads it.

JAX executes what it loads, zstd entries carry no checksum, and an entry's bytes copied under another key load
silently and compute the wrong thing (docs/jax-internals.md, "Entry bytes"). Two checks catch that: the digest its
writer recorded (jaxcache.attestations says what each kind of record is worth), and the module name inside the
executable (jaxcache.executable), which must equal the file name's. Entries are read as a stream: memory stays
bounded whatever their size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from jaxcache import signing, skips
from jaxcache.attestations import Attestation, from_signature, load
from jaxcache.entry import Status, validate_hashing
from jaxcache.errors import NotRegularFileError
from jaxcache.executable import embedded_module
from jaxcache.parallel import bounded_map
from jaxcache.scan import Entry
from jaxcache.storage.base import Storage

OK = "ok"
TAMPERED = "tampered"
MISMATCHED = "mismatched"
DIFFERS = "differs"
CORRUPT = "corrupt"
PENDING = "pending"
UNATTESTED = "unattested"
# Most severe first: an entry's class is the first that applies and acts; every applying one is listed. Proof comes
# before `differs`: a torn entry whose unsigned digest also differs is `corrupt`, which the default prune removes.
CLASSES = (TAMPERED, MISMATCHED, CORRUPT, DIFFERS, PENDING, UNATTESTED, OK)
BAD_CLASSES = (TAMPERED, MISMATCHED, DIFFERS, CORRUPT)
#: Where the embedded-name check is pinned by tests; elsewhere a mismatch is shown but acts on nothing by itself.
PINNED_PLATFORMS = frozenset({"cpu"})

__all__ = ["Attestation", "Verdict", "classify", "judge", "load_attestations", "embedded_module", "verify"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One entry's integrity. ``classification`` is what jobs and prunes act on; ``classes`` lists every finding."""

    key: str
    name: str
    classification: str
    classes: tuple[str, ...]
    reasons: tuple[str, ...]
    sha256: str | None
    size_bytes: int
    embedded_module: str | None
    attested_by: str | None = None
    #: ``bad signature`` when a signature beside the entry is malformed, for another key, or claims a trusted key and
    #: does not verify: it proves nothing (the class is what the bytes prove), but someone wrote it there.
    signature: str | None = None


def sha256_hex(data: bytes) -> str:
    """The digest recorded for an entry's stored (compressed) bytes."""
    return hashlib.sha256(data).hexdigest()


def load_attestations(storage: Storage) -> dict[str, Attestation]:
    """The unsigned digest that counts for each key of a root, from its run and coverage records."""
    return load(storage).by_key


def judge(entry: Entry, chunks: Iterable[bytes], attestation: Attestation | None, *, now: float,
          min_age_s: float, signed: Sequence[Attestation] = (), notes: Sequence[str] = (),
          signature: str | None = None) -> Verdict:
    """Judge one entry from its bytes, read once as a stream. ``signed``: digests trusted keys signed (the only
    proof: ``tampered`` means the bytes differ from every one); ``attestation``: the unsigned digest that counts
    (a mismatch is ``differs``). Entries younger than ``min_age_s`` that look broken are ``pending``: JAX writes
    non-atomically, so a file being written looks truncated. ``signature``: what the signatures beside it were
    found to be (``bad signature``), named on the verdict whatever its class."""
    validation, sha, size = validate_hashing(chunks)
    module = embedded_module(validation.head) if validation.status is Status.OK else None
    classes: list[str] = []
    reasons: list[str] = list(notes)
    matching = next((a for a in signed if a.sha256 == sha), None)
    if signed and matching is None:
        classes.append(TAMPERED)
        reasons.append(f"digest {sha[:12]}… differs from the {signed[0].sha256[:12]}… {signed[0].described()}:"
                       " the bytes changed after a trusted key signed them")
    if matching is not None:
        if attestation is not None and attestation.sha256 != sha:
            reasons.append(f"an unsigned digest {attestation.sha256[:12]}… {attestation.described()} disagrees;"
                           " the signed one counts")
        attestation = matching
    elif not signed and attestation is not None and attestation.sha256 != sha:
        classes.append(DIFFERS)
        reasons.append(f"digest {sha[:12]}… differs from the unsigned {attestation.sha256[:12]}…"
                       f" {attestation.described()}; whoever can write the bucket (or holds a report token) could"
                       " have made either, so this is not proof of tampering")
    elif signed and attestation is None:
        attestation = signed[0]
    pinned = attestation is not None and attestation.platform in PINNED_PLATFORMS
    if module is not None and module != entry.module:
        classes.append(MISMATCHED)
        reasons.append(f"the executable inside is {module!r}, but the file name says {entry.module!r}: bytes of"
                       " another program" + ("" if pinned else _UNPINNED.format(
                           attestation.platform if attestation is not None and attestation.platform else "unknown")))
    if validation.status is not Status.OK:
        classes.append(CORRUPT)
        reasons.append(validation.reason or "does not decompress")
    acting = [c for c in classes if c != MISMATCHED or pinned]
    if now - entry.mtime_s < min_age_s and acting and MISMATCHED not in acting:
        classes, acting = [PENDING], [PENDING]
        reasons = [f"written {max(now - entry.mtime_s, 0):.0f} s ago (grace {min_age_s:.0f} s): may still be"
                   f" being written; {'; '.join(reasons)}"]
    if not acting:
        fallback = OK if attestation is not None else UNATTESTED
        classes.append(fallback)
        acting.append(fallback)
        if attestation is None:
            reasons.append("no writer recorded a digest (written by plain JAX, or before jaxcache)")
    ordered = tuple(c for c in CLASSES if c in classes)
    return Verdict(
        key=entry.key, name=entry.name, classification=next(c for c in CLASSES if c in acting), classes=ordered,
        reasons=tuple(reasons), sha256=sha, size_bytes=size, embedded_module=module,
        attested_by=attestation.writer if attestation is not None else None, signature=signature,
    )


_UNPINNED = (" (not acted on by itself: the embedded-name check is pinned on CPU entries only, and this entry's"
             " writer ran on {0}; `jaxcache doctor --verify` on entries the GPU check writes will pin it there)")


def classify(entry: Entry, data: bytes, attestation: Attestation | None, *, now: float,
             min_age_s: float) -> Verdict:
    """:func:`judge` over bytes already in memory."""
    return judge(entry, (data,), attestation, now=now, min_age_s=min_age_s)


def verify(
    storage: Storage, entries: Iterable[Entry], attestations: Mapping[str, Attestation], *, now: float,
    min_age_s: float, workers: int | None = None, trusted: signing.TrustedKeys | None = None,
) -> Iterator[Verdict]:
    """Read and judge every entry with its ``-sig`` object (in parallel, order kept); entries deleted meanwhile are
    skipped. ``trusted``: the keys whose signatures prove (default: JAXCACHE_TRUSTED_KEYS)."""
    keys = signing.TrustedKeys.from_env() if trusted is None else trusted
    work = partial(judge_stored, storage, attestations, keys, now, min_age_s)
    for verdict in bounded_map(work, entries, workers=workers or storage.io_workers):
        if verdict is not None:
            yield verdict


def judge_stored(storage: Storage, attestations: Mapping[str, Attestation], trusted: signing.TrustedKeys,
                 now: float, min_age_s: float, entry: Entry) -> Verdict | None:
    """Read one entry and its signatures and judge it; None when it is gone or no longer a file."""
    try:
        chunks = storage.read_chunks(entry.name)
    except NotRegularFileError:
        return None  # replaced by a FIFO, a link or a folder since the listing: skipped (counted in storage.skipped)
    if chunks is None:
        return None
    unsigned = attestations.get(entry.key)
    found = signing.read(storage, entry.key, trusted) if trusted else signing.Found()
    platform = unsigned.platform if unsigned is not None else None
    signed = [from_signature(s, platform) for s in found.trusted]
    bad = skips.BAD_SIGNATURE if skips.BAD_SIGNATURE in found.refused else None
    return judge(entry, chunks, unsigned, now=now, min_age_s=min_age_s, signed=signed, notes=found.notes,
                 signature=bad)
