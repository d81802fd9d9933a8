"""Rescans of a cache's root into the catalog: one asked for by a route, and the background loop's rounds."""

from __future__ import annotations

import logging
import time

from sqlalchemy import select, update

from jaxcache.errors import JaxcacheError
from jaxcache.service.catalog.generations import USAGE
from jaxcache.service.catalog.locks import LockBusyError
from jaxcache.service.catalog.models import CacheRow
from jaxcache.service.prune.run import close_interrupted_prunes
from jaxcache.service.reports import inbox
from jaxcache.service.reports.draining import note_folded
from jaxcache.service.rescan import scan as rescan_pass
from jaxcache.service.rescan.scan import RescanResult
from jaxcache.service.state import State

log = logging.getLogger("jaxcache.service")


def rescan(state: State, name: str, *, wait_s: float | None = None) -> RescanResult:
    """Rescan one cache, waiting at most ``wait_s`` for one running elsewhere (then LockBusyError); records metrics."""
    try:
        result = rescan_pass.rescan(state.catalog, name, state.storages[name], wait_s=wait_s,
                                    retain_s=state.settings.records_retain_s,
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
    note_folded(state, name, result.folded, result.misses_explained, result.dropped)
    if result.records_malformed:
        state.metrics.reports_malformed.labels(inbox.STORAGE).inc(result.records_malformed)
    if result.records_compacted:
        state.metrics.records_compacted.labels(name).inc(result.records_compacted)
        state.generations.bump(name, USAGE)  # the usage windows' runs may be gone
    if result.added or result.removed or result.updated:
        state.changed(name)
        state.stats(name)  # computed here, in the scan thread, so this process's requests find it ready
    return result


def ensure_scanned(state: State, name: str) -> None:
    """Rescan ``name`` unless this process has seen a scan of it (its own, or another's in the catalog)."""
    if name not in state.scanned:
        # Another process may have scanned it: listing again would cost a listing and block the rescan loop.
        state.follow()
    if name not in state.scanned:
        rescan(state, name)


def rescan_all(state: State) -> list[tuple[str, Exception]]:
    """One round of background rescans, skipping those scanned elsewhere lately; returns the failures."""
    now = time.time()
    failed: list[tuple[str, Exception]] = []
    with state.catalog.session() as s:
        last = {r.name: r.last_scan_s for r in s.scalars(select(CacheRow))}
    for name in state.settings.caches:
        at = last.get(name)
        # A process's first round always rescans: what was written while it was down must not wait a period.
        if at is not None and name in state.rounds_done and 0 <= now - at < state.settings.rescan_s / 2:
            log.debug("rescan of %s skipped: scanned %.0f s ago (by another process)", name, now - at)
            continue
        state.loops.on_cache(name)
        try:
            rescan(state, name, wait_s=0)
            state.rounds_done.add(name)
            close_interrupted_prunes(state, name)
        except LockBusyError:
            log.info("rescan of %s skipped: another process is running one", name)
        except Exception as exc:  # noqa: BLE001 - a root or the database gone: the others still get rescanned
            failed.append((name, exc))
    return failed
