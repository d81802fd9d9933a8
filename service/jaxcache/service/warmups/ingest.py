"""Warm-up coverage records (``.jaxcache/warmups/<id>.json``, written once; a round reads the new ones: rounds.py)
into the catalog, replacing that warm-up's rows."""

from __future__ import annotations

import time

import msgspec
from sqlalchemy import delete, insert

from jaxcache import coverage
from jaxcache.attestations import FILE, from_coverage
from jaxcache.coverage import WarmupRecord
from jaxcache.service.catalog import attestations
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import WarmupKeyRow, WarmupRow


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
