"""Retention of run records (``JAXCACHE_RECORDS_RETAIN_D``): old runs folded into ``key_history`` in bounded
batches, then their record files and old prune items deleted, at the end of a rescan."""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from sqlalchemy import CursorResult, delete, or_, select, tuple_, update

from jaxcache import records
from jaxcache.errors import PreconditionFailedError, StorageError
from jaxcache.parallel import bounded_map
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import (
    RUNNING,
    CacheRow,
    ProcessKeysRow,
    PruneItemRow,
    PruneRow,
    RecordFileRow,
    RunRow,
)
from jaxcache.service.reports.ingest import usage
from jaxcache.service.reports.records import malformed
from jaxcache.storage import Storage, same_stat
from jaxcache.storage.base import stat_of

log = logging.getLogger("jaxcache.service")

DAY_S = 86400.0
#: Per transaction: other writers of the cache (report ingestion, on every replica) wait for each one.
BATCH_PROCESSES = 2000
BATCH_KEYS = 200_000  # keys of those processes' figures: one process may have touched 100k keys
_CHUNK = 500
_RECORD = re.compile(r"([^/]+)-p([0-9]+)\.json")


@dataclass(frozen=True, slots=True)
class Compaction:
    runs: int  # processes folded into key_history, their run and usage rows deleted
    files: int  # record files deleted from storage
    prune_items: int  # planned-object rows of prune audits older than the horizon


def compact(catalog: Catalog, cache: str, storage: Storage, *, retain_s: float, now: float | None = None) -> Compaction:
    """Fold ``cache``'s runs older than ``retain_s`` into key_history; the caller holds the scan lock."""
    horizon = (time.time() if now is None else now) - retain_s
    compacted: list[tuple[str, int, float]] = []
    while batch := _compact_batch(catalog, cache, horizon):
        compacted += batch
    files = _delete_files(catalog, cache, storage, horizon, compacted)
    with catalog.session() as s:
        old = select(PruneRow.id).where(PruneRow.cache == cache, PruneRow.at_s < horizon,
                                        PruneRow.state != RUNNING)  # a running one is closed from its items
        items = cast(CursorResult, s.execute(delete(PruneItemRow).where(PruneItemRow.prune_id.in_(old)))).rowcount
    if compacted or files:
        log.info("cache %s: compacted %d run records older than %.0f days, deleted %d record files", cache,
                 len(compacted), retain_s / DAY_S, files)
    return Compaction(len(compacted), files, items or 0)


def _compact_batch(catalog: Catalog, cache: str, horizon: float) -> list[tuple[str, int, float]]:
    """One transaction folding a batch of old processes into key_history; returns what it compacted (none: done)."""
    with catalog.writing(cache) as s:
        # First: a record older than the horizon is stale from the moment its run may be in history.
        s.execute(update(CacheRow).where(CacheRow.name == cache, or_(CacheRow.compacted_before_s.is_(None),
                                                                     CacheRow.compacted_before_s < horizon))
                  .values(compacted_before_s=horizon))
        found = s.execute(select(RunRow.run_id, RunRow.process_index, RunRow.started_s, RunRow.keys)
                          .where(RunRow.cache == cache, RunRow.updated_s < horizon)
                          .order_by(RunRow.updated_s, RunRow.run_id, RunRow.process_index)
                          .limit(BATCH_PROCESSES)).all()
        batch: list[tuple[str, int, float]] = []
        keys = 0
        for r in found:
            if batch and keys + r.keys > BATCH_KEYS:
                break
            batch.append((r.run_id, r.process_index, r.started_s))
            keys += r.keys
        pairs = [(run, index) for run, index, _ in batch]
        if not pairs:
            return batch
        conn = s.connection()
        touched: dict[str, set[str]] = defaultdict(set)
        for chunk in usage.chunks(pairs, _CHUNK):
            usage.fold_history(conn, cache, chunk)
            gone = s.execute(delete(ProcessKeysRow).where(ProcessKeysRow.cache == cache, tuple_(
                ProcessKeysRow.run_id, ProcessKeysRow.process_index).in_(chunk)).returning(
                ProcessKeysRow.run_id, ProcessKeysRow.key))
            for run_id, key in gone:
                touched[run_id].add(key)
            s.execute(delete(RunRow).where(RunRow.cache == cache,
                                           tuple_(RunRow.run_id, RunRow.process_index).in_(chunk)))
        # Key_stats stay as they are: aggregates add the history back.
        for run_id, keys_of_run in sorted(touched.items()):
            usage.usage_rows(conn, cache, sorted(keys_of_run), run_id=run_id)
    return batch


def _delete_files(catalog: Catalog, cache: str, storage: Storage, horizon: float,
                  compacted: list[tuple[str, int, float]]) -> int:
    """Delete compacted runs' record files, and old ones that are malformed or whose run the catalog lacks."""
    targets: dict[str, Any] = {records.record_name(run, index, started): None for run, index, started in compacted}
    names = list(targets)
    with catalog.reader() as conn:
        cols = (RecordFileRow.name, RecordFileRow.size_bytes, RecordFileRow.mtime_s, RecordFileRow.version,
                RecordFileRow.error)
        rows = list(conn.execute(select(*cols).where(RecordFileRow.cache == cache, RecordFileRow.mtime_s < horizon)))
        for part in usage.chunks(names, _CHUNK):
            rows += conn.execute(select(*cols).where(RecordFileRow.cache == cache, RecordFileRow.name.in_(part)))
        old = {r.name: r for r in rows}
        owners = {r.name: _owner(r.name) for r in old.values() if r.error is None and r.name not in targets}
        pairs = sorted({p for p in owners.values() if p is not None})
        live: set[tuple[str, int]] = set()
        for held in usage.chunks(pairs, _CHUNK):
            live.update((run, index) for run, index in conn.execute(select(RunRow.run_id, RunRow.process_index).where(
                RunRow.cache == cache, tuple_(RunRow.run_id, RunRow.process_index).in_(held))))
    for name, r in old.items():
        if name in targets or r.error is not None or owners.get(name) not in live:
            targets[name] = r
    gone, failed = [], []
    for name, outcome in bounded_map(partial(_delete_one, storage), targets.items(), workers=storage.io_workers):
        if outcome is None:
            gone.append(name)
        elif outcome:  # "" is a file rewritten since it was read: left for the next listing to read
            failed.append(outcome)
    if failed:
        log.warning("cache %s: %d old run record files could not be deleted (tried again next rescan): %s", cache,
                    len(failed), failed[0])
    malformed.forget(catalog, cache, gone)
    return len(gone)


def _owner(name: str) -> tuple[str, int] | None:
    """The (run_id, process_index) a record file's name says it holds."""
    m = _RECORD.fullmatch(name.rsplit("/", 1)[-1])
    return (m.group(1), int(m.group(2))) if m else None


def _delete_one(storage: Storage, item: tuple[str, Any]) -> tuple[str, str | None]:
    """Delete one record file unless rewritten since read; its name and None (gone), "" (left) or why it failed."""
    name, row = item
    try:
        if row is None:  # the run came by POST only, or its file was never read: whatever is there is as old
            storage.delete(name)
        elif row.version is not None:  # the store's precondition: deleted only if not replaced since read
            storage.delete(name, if_version=row.version)
        else:  # no versions (a directory): compare what is there with what was read
            info = storage.stat(name)
            if info is not None and not same_stat(stat_of(info), (row.size_bytes, row.mtime_s, row.version)):
                return name, ""
            if info is not None:
                storage.delete(name)
    except PreconditionFailedError:
        return name, ""
    except StorageError as exc:
        return name, str(exc)
    return name, None
