"""Run records into the catalog, one process's record at a time or a batch of them, from ``POST /v1/reports`` and
from rescans.

A record is rewritten while its process runs (its counts are totals so far), so ingesting one is an upsert per
(cache, run id, process index): the process's figures (:mod:`.figures`) are replaced, and with them its part of its
run's usage rows (one per key: the run's processes summed, :mod:`.groups`) and of its keys' aggregates, as
differences where that is exact, else rebuilt (:mod:`.aggregates`). Ingesting a record twice, an older version of
one, or one older than the cache's compaction watermark (its run may be in key_history already), changes nothing.
How the figures are defined: docs/service.md, "Run records".
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from jaxcache.attestations import FILE, REPORTED, Attestation, from_run
from jaxcache.errors import InvalidInputError
from jaxcache.records import RunRecord
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.ingestion import attestations
from jaxcache.service.ingestion import explain as explaining
from jaxcache.service.ingestion.batch import REPORT, STORAGE, Batch
from jaxcache.service.ingestion.explain import Pending
from jaxcache.service.ingestion.packed import Report, report_of

__all__ = ["REPORT", "STORAGE", "IngestResult", "PendingMisses", "check", "check_keys", "ingest", "ingest_batch"]



@dataclass(frozen=True, slots=True)
class IngestResult:
    """What ingesting one record did."""

    cache: str
    run_id: str
    process_index: int
    keys: int  # keys stored for the process
    stale: bool  # a newer version of this record was already ingested: nothing changed
    misses: dict[str, int] = field(default_factory=dict)  # misses counted for the first time, by cause
    pending: tuple[Pending, ...] = ()  # usage rows of misses stored unexplained (``explain=False``)


def ingest(catalog: Catalog, cache: str, record: RunRecord | Report, *, source: str = REPORT,
           secret: bytes | None = None,
           record_name: str | None = None, explain: bool = True) -> IngestResult:
    """Store ``record`` (already parsed) for ``cache``, update its run's usage rows and its keys' aggregates, and
    explain its new misses (unless ``explain`` is False: a rescan explains all its records' misses at its end, when
    every record it read is in, whatever order it read them in).

    Raises :class:`InvalidInputError` (and stores nothing) if the record names a key twice.
    """
    if isinstance(record, RunRecord):
        check(record)
        record = report_of(record)
    with catalog.writing(cache) as s:
        work = Batch(catalog, s, cache, source)
        work.load([record])
        stale, keys, attest = work.take(record)
        pending, counts = work.apply(None)
        if explain and pending:
            counts.update(explaining.explain_pending(s, cache, pending))
            pending = []
    catalog.count_misses(cache, counts)
    # A POSTed digest came with a report token; one read from the bucket is worth what the bucket's writers are.
    # Recorded for compacted records too: digests are evidence, never counts (the first accepted one counts, the
    # others are kept as conflicts), and a back-dated record must not hide a forged digest.
    found = _attestations(record, source, secret, record_name) if attest else []
    if found:
        attestations.record(catalog, cache, found)
    return IngestResult(cache, record.run_id, record.process_index, keys, stale, dict(counts), tuple(pending))


class PendingMisses:
    """Usage rows of misses not explained yet, in the order they were stored (each once)."""

    def __init__(self) -> None:
        self._rows: dict[Pending, None] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, pending: Iterable[Pending]) -> None:
        self._rows.update(dict.fromkeys(pending))

    def take_record(self, record: Report) -> list[Pending]:
        """The rows held of ``record``'s keys, which are no longer held."""
        run_id, job = record.run_id, record.header.job
        mine = [p for p in (Pending(run_id, job, key) for key in record.keys) if p in self._rows]
        for p in mine:
            del self._rows[p]
        return mine

    def take(self, limit: int | None = None) -> list[Pending]:
        """The rows held (at most ``limit``), which are no longer held."""
        out = list(self._rows) if limit is None else list(self._rows)[:limit]
        for p in out:
            del self._rows[p]
        return out


def ingest_batch(catalog: Catalog, cache: str, batch: Sequence[Report], *, source: str = REPORT,
                 secret: bytes | None = None, later: PendingMisses | None = None,
                 copies: set[str] | None = None) -> list[IngestResult]:
    """Ingest several records of ``cache`` in one write transaction, each as :func:`ingest` would, in order, their
    digests recorded in the same transaction. What a job's processes send at once share their runs' usage rows and
    their keys, so a batch reads and writes each once instead of once a record. Their misses are explained together
    at the end (one read of the history for all), or, given ``later``, added to it for the caller to explain
    (:func:`explaining.explain_stored`) once it has time; given ``copies``, likewise the keys whose copies on entry
    rows are due (:func:`aggregates.copy_to_entries`). Any error stores nothing of the batch (the caller tries the
    records one at a time); each record must have passed :func:`check`. The results' ``misses`` stay empty: the
    count goes to the catalog's listener."""
    results: list[IngestResult] = []
    found: list[Attestation] = []
    with catalog.writing(cache) as s:
        work = Batch(catalog, s, cache, source)
        work.load(batch)
        for record in batch:
            stale, keys, attest = work.take(record)
            results.append(IngestResult(cache, record.run_id, record.process_index, keys, stale))
            if attest:
                found += _attestations(record, source, secret, None)
        pending, counts = work.apply(copies)
        if later is not None:
            later.add(pending)
        elif pending:
            counts.update(explaining.explain_pending(s, cache, pending))
        if found:
            attestations.record_in(catalog, s, cache, found)
    catalog.count_misses(cache, counts)
    return results


def check(record: RunRecord) -> None:
    """Refuse (InvalidInputError) a record the catalog cannot store: one that names a key twice."""
    check_keys([u.key for u in record.keys])


def check_keys(keys: Sequence[str]) -> None:
    """:func:`check` of a record's keys."""
    if len(set(keys)) == len(keys):
        return
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise InvalidInputError(f"run record lists key {key!r} twice: one entry per key")
        seen.add(key)


def _attestations(record: Report, source: str, secret: bytes | None, name: str | None) -> list[Attestation]:
    if not record.digests:
        return []
    kind = REPORTED if source == REPORT else FILE
    return list(from_run(record.attested(), source=kind, at=time.time(), secret=secret, record=name))


