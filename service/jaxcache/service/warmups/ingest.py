"""Warm-up coverage records (``.jaxcache/warmups/<id>.json``, written once) into the catalog, replacing that
warm-up's rows, and which of its programs jobs hit since."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import msgspec
from sqlalchemy import delete, insert, select

from jaxcache import coverage
from jaxcache.attestations import FILE, from_coverage
from jaxcache.coverage import WarmupRecord
from jaxcache.parallel import bounded_map
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import RecordFileRow, WarmupKeyRow, WarmupRow
from jaxcache.service.integrity import attestations
from jaxcache.service.reports import malformed
from jaxcache.storage import ObjectInfo, Storage


@dataclass(frozen=True, slots=True)
class CoverageScan:
    ingested: int
    malformed: int


def ingest(catalog: Catalog, cache: str, record: WarmupRecord, *, record_name: str | None = None) -> None:
    """Store one warm-up (replacing an earlier ingestion of the same id) and its digests."""
    programs = {p.key: p for p in record.programs}  # a key listed twice counts once
    counts = {status: sum(p.status == status for p in programs.values()) for status in coverage.STATUSES}
    with catalog.writing(cache) as s:
        s.execute(delete(WarmupKeyRow).where(WarmupKeyRow.cache == cache, WarmupKeyRow.warmup_id == record.id))
        s.merge(WarmupRow(
            cache=cache, id=record.id, job=record.job, topology=record.topology, platform=record.platform,
            gpu_model=record.gpu_model, started_s=record.started_at, finished_s=record.finished_at,
            fingerprint=record.fingerprint.as_dict(), programs=len(programs), written=counts[coverage.WRITTEN],
            present=counts[coverage.PRESENT], not_written=counts[coverage.NOT_WRITTEN],
            compile_s=sum(p.compile_s or 0.0 for p in programs.values() if p.status != coverage.PRESENT),
        ))
        rows = [dict(cache=cache, warmup_id=record.id, key=p.key, function=p.function, status=p.status,
                     compile_s=p.compile_s, size_bytes=p.size_bytes, reason=p.reason,
                     parts=None if p.parts is None else msgspec.to_builtins(p.parts),
                     program=None if p.program is None else msgspec.to_builtins(p.program))
                for p in programs.values()]
        for i in range(0, len(rows), 5000):
            s.execute(insert(WarmupKeyRow), rows[i : i + 5000])
    attestations.record(catalog, cache, from_coverage(record, source=FILE, at=time.time(), record=record_name))


def scan(catalog: Catalog, cache: str, storage: Storage) -> CoverageScan:
    """Ingest coverage records that are new or changed since the last rescan (malformed ones: counted, one warning)."""
    listing = {i.name: i for i in storage.iter_objects(coverage.WARMUPS_PREFIX, recursive=True)
               if i.name.endswith(".json")}
    with catalog.reader() as conn:
        known = {r.name: (r.size_bytes, r.mtime_s, r.generation) for r in conn.execute(
            select(RecordFileRow.name, RecordFileRow.size_bytes, RecordFileRow.mtime_s, RecordFileRow.generation)
            .where(RecordFileRow.cache == cache, RecordFileRow.name.like(coverage.WARMUPS_PREFIX + "%")))}
    todo = [i for n, i in sorted(listing.items()) if known.get(n) != (i.size_bytes, i.mtime_s, i.generation)]
    ingested, skipped = 0, malformed.Skipped("warm-up record")
    for info, data, error in bounded_map(partial(_read, storage), todo, workers=storage.io_workers):
        if data is None and error is None:
            continue  # deleted since the listing
        if data is not None:
            try:
                ingest(catalog, cache, coverage.parse(data), record_name=info.name)
                ingested += 1
            except malformed.REFUSALS as exc:
                error = malformed.reason(exc)
        if error is not None:
            skipped.add(info.name, error)
        with catalog.writing(cache) as s:
            s.merge(RecordFileRow(cache=cache, name=info.name, size_bytes=info.size_bytes, mtime_s=info.mtime_s,
                                  generation=info.generation, error=None if error is None else error[:2000]))
    skipped.log(cache)
    return CoverageScan(ingested, len(skipped))


def _read(storage: Storage, info: ObjectInfo) -> tuple[ObjectInfo, bytes | None, str | None]:
    return info, *malformed.read_file(storage, info, coverage.MAX_COVERAGE_BYTES)
