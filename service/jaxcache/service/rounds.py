"""A round: a cache's rescan and what follows it, in this order (the one module that puts features together for it):

1. rescan: the root asked whether it answers, within a deadline (reachability.py), then the entry rows in line with
   storage (rescan/scan.py), under the cache's scan lock, in which
2. run records: new or changed record files go into the report inbox (reports/records/runfiles.py);
3. warm-up records: new or changed coverage records are stored (warmups/ingest.py);
4. drain: the inbox is folded, so misses are explained against all the rescan read (reports/ingest/queue.py);
5. retention: runs older than JAXCACHE_RECORDS_RETAIN_D are compacted (reports/records/retention.py);
6. summary, once the lock is released: metrics, change counts, statistics computed ahead (caches/summary.py).

app.py hands :func:`rescan_cache` to the loops and to the features that need a rescan; no feature imports this."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from sqlalchemy import select, update

from jaxcache import coverage
from jaxcache.errors import JaxcacheError
from jaxcache.service.caches import summary
from jaxcache.service.catalog.coordination import LockBusyError
from jaxcache.service.catalog.database import USAGE, Catalog
from jaxcache.service.catalog.models import CacheRow
from jaxcache.service.metrics import STORAGE
from jaxcache.service.prune import audit as prune_audit
from jaxcache.service.reports.ingest import queue
from jaxcache.service.reports.records import malformed, retention, runfiles
from jaxcache.service.rescan import scan
from jaxcache.service.rescan.scan import Followed, RescanResult
from jaxcache.service.state import State
from jaxcache.service.warmups import ingest as warmups
from jaxcache.storage import Storage

log = logging.getLogger("jaxcache.service")


def after_rescan(catalog: Catalog, cache: str, storage: Storage, *, retain_s: float | None,
                 on_misses: queue.OnMisses | None) -> Followed:
    """Steps 2 to 5, in the rescan's lock; with ``retain_s`` None, nothing is compacted."""
    found = runfiles.scan_records(catalog, cache, storage)
    warmed = warmup_records(catalog, cache, storage)
    # Once everything this rescan read is in, so misses are explained against all of it.
    drained = queue.drain(catalog, cache, root=storage.url, on_misses=on_misses)
    compacted = retention.compact(catalog, cache, storage, retain_s=retain_s).runs if retain_s is not None else 0
    return Followed(records_ingested=found.ingested, records_malformed=found.malformed, warmups_ingested=warmed[0],
                    records_compacted=compacted, misses_explained=sum(drained.misses.values()),
                    folded=dict(drained.fresh), dropped=dict(drained.malformed))


def warmup_records(catalog: Catalog, cache: str, storage: Storage) -> tuple[int, int]:
    """Store coverage records new or changed since the last rescan; (ingested, malformed: counted, one warning)."""
    listing = {i.name: i for i in storage.iter_objects(coverage.WARMUPS_PREFIX, recursive=True)
               if i.name.endswith(".json")}
    todo = malformed.changed(listing, malformed.known(catalog, cache, [coverage.WARMUPS_PREFIX]))
    return malformed.ingest_files(
        catalog, cache, storage, todo, what="warm-up record", max_bytes=coverage.MAX_COVERAGE_BYTES,
        ingest=lambda info, data: warmups.ingest(catalog, cache, coverage.parse(data), record_name=info.name))


def rescan(catalog: Catalog, cache: str, storage: Storage, *, retain_s: float | None = None,
           on_misses: queue.OnMisses | None = None, **options: Any) -> RescanResult:
    """Steps 1 to 5 for ``cache`` (``options``: rescan.scan.rescan's)."""
    return scan.rescan(catalog, cache, storage, after=partial(after_rescan, retain_s=retain_s, on_misses=on_misses),
                       **options)


def rescan_cache(state: State, name: str, *, wait_s: float | None = None) -> RescanResult:
    """A round of ``name``, waiting at most ``wait_s`` for one running elsewhere (then LockBusyError); records
    metrics."""
    try:
        # The root's first answer is bounded (jaxcache.reach): a store that stopped answering fails the rescan within
        # seconds, and the loop shows failing, rather than a pass waiting minutes on its library's retries.
        state.reach.check(name)
        result = rescan(state.catalog, name, state.storages[name], wait_s=wait_s,
                        retain_s=state.settings.records_retain_s,
                        on_misses=partial(queue.count_misses, state.metrics, name),
                        release_from_entries=state.settings.release_memory_from_entries)
    except LockBusyError:
        raise
    except Exception as exc:
        # Per cache, which the loops' own error count is not: which bucket's scans fail, whatever the cause.
        state.metrics.scan_errors.labels(name, type(exc).__name__).inc()
        if isinstance(exc, JaxcacheError):
            with state.catalog.session() as s:  # a write without a read first: see rescan/scan.py
                s.execute(update(CacheRow).where(CacheRow.name == name).values(last_scan_error=str(exc)[:2000]))
        raise
    state.scanned.add(name)
    state.metrics.scan_seconds.labels(name).observe(result.seconds)
    queue.note_folded(state, name, result.folded, result.misses_explained, result.dropped)
    if result.records_malformed:
        state.metrics.reports_malformed.labels(STORAGE).inc(result.records_malformed)
    if result.records_compacted:
        state.metrics.records_compacted.labels(name).inc(result.records_compacted)
        state.generations.bump(name, USAGE)  # the usage windows' runs may be gone
    if result.added or result.removed or result.updated:
        summary.changed(state, name)
        summary.keep(state, name)
    return result


def ensure_scanned(state: State, name: str) -> None:
    """Rescan ``name`` unless this process has seen a scan of it (its own, or another's in the catalog); raise why its
    root cannot be reached (within the deadline), so that an integrity pass fails at once, not entry by entry."""
    state.reach.check(name)
    if name not in state.scanned:
        # Another process may have scanned it: listing again would cost a listing and block the rescan loop.
        state.follow()
    if name in state.scanned:
        return
    try:
        rescan_cache(state, name, wait_s=0)
    except LockBusyError:
        # Another process is scanning it: once that scan ends it is this process's too. A second scan right after
        # it would list the whole root again and hold its listing beside the first process's (at 1M entries, about
        # 700 MiB more at the service's peak).
        scan.wait_for_rescans(state.catalog, name)
        state.follow()
        if name not in state.scanned:  # that scan failed: this process scans
            rescan_cache(state, name)


def rescan_all(state: State, rounds_done: set[str]) -> list[tuple[str, Exception]]:
    """One round of background rescans, skipping those scanned elsewhere lately; returns the failures.
    ``rounds_done``: the caches this process has rescanned in a round (app.py keeps it, one per app)."""
    now = time.time()
    failed: list[tuple[str, Exception]] = []
    with state.catalog.session() as s:
        last = {r.name: r.last_scan_s for r in s.scalars(select(CacheRow))}
    for name in state.settings.caches:
        at = last.get(name)
        # A process's first round always rescans: what was written while it was down must not wait a period.
        if at is not None and name in rounds_done and 0 <= now - at < state.settings.rescan_s / 2:
            log.debug("rescan of %s skipped: scanned %.0f s ago (by another process)", name, now - at)
            continue
        state.loops.on_cache(name)
        try:
            rescan_cache(state, name, wait_s=0)
            rounds_done.add(name)
            close_interrupted_prunes(state, name)
        except LockBusyError:
            log.info("rescan of %s skipped: another process is running one", name)
        except Exception as exc:  # noqa: BLE001 - a root or the database gone: the others still get rescanned
            failed.append((name, exc))
    return failed


def close_interrupted_prunes(state: State, name: str) -> None:
    """Close the audit rows of prunes of ``name`` whose replica died mid-way, unless a prune holds the lock."""
    if not prune_audit.any_running(state.catalog, name):
        # Not waiting for the lock, so a prune asked as soon as the replica is ready is not refused.
        return
    lock = state.prune_locks.get(name)
    if not lock.acquire(blocking=False):
        return
    try:
        interrupted = prune_audit.tally_interrupted(state.catalog, name, state.storages[name])
    finally:
        lock.release()
    # Refreshed after closing, so a reader of the closed audit may prune at once (a prune between closes them first).
    closed = prune_audit.close(state.catalog, name, interrupted)
    if closed:
        summary.changed(state, name)
        summary.keep(state, name)
