"""A configured cache as the API and the dashboard show it: its size and last scan, its statistics and usage (kept
until its entries or usage change, or a minute passes), and its totals' gauges, set again after each change."""

from __future__ import annotations

import time
from dataclasses import dataclass

from jaxcache.service.caches import stats
from jaxcache.service.catalog.database import ENTRIES, Catalog
from jaxcache.service.catalog.models import CacheRow
from jaxcache.service.metrics import Metrics
from jaxcache.service.reports import queries, queue
from jaxcache.service.state import State

_DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class SkippedName:
    """One object the last rescan skipped: its name escaped for display, and why."""

    name: str
    why: str


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """A configured cache, its size and its last scan (GET /v1/caches, the dashboard's index)."""

    name: str
    url: str
    entries: int
    size_bytes: int
    last_scan_s: float | None
    last_scan_seconds: float | None
    last_scan_error: str | None
    reports_waiting: int
    last_scan_skipped: int | None = None
    last_scan_skipped_names: tuple[SkippedName, ...] = ()


def caches(state: State) -> list[CacheInfo]:
    """Every configured cache with its size and last scan."""
    out = []
    waiting = queue.waiting_by_cache(state.catalog)
    with state.catalog.session() as s:
        for name in state.settings.caches:
            row = s.get(CacheRow, name)
            count, size = stats.cache_totals(s, name)
            out.append(CacheInfo(
                name=name, url=state.storages[name].url, entries=count, size_bytes=size,
                last_scan_s=row.last_scan_s if row else None,
                last_scan_seconds=row.last_scan_seconds if row else None,
                last_scan_error=row.last_scan_error if row else None,
                reports_waiting=waiting.get(name, 0),
                last_scan_skipped=row.last_scan_skipped if row else None,
                last_scan_skipped_names=tuple(SkippedName(str(n.get("name", "")), str(n.get("why", "")))
                                              for n in (row.last_scan_skipped_names if row else None) or ()),
            ))
    return out


def stats_of(state: State, name: str) -> dict:
    """Statistics of one cache (its entries and, :func:`usage_of`, its hit rates)."""
    return {**state.computed("stats", name, lambda n: _stats(state, n)), **usage_of(state, name)}


def usage_of(state: State, name: str) -> dict:
    """Hit rate and seconds saved over the last 24 h and 7 d, seconds saved by function, misses by cause."""
    return state.computed("usage", name, lambda n: _usage(state, n))


def _stats(state: State, name: str) -> dict:
    with state.catalog.session() as s:
        return stats.stats(s, name)


def _usage(state: State, name: str) -> dict:
    now = time.time()
    with state.catalog.reader() as conn:
        return {"last_24h": queries.usage_window(conn, name, since=now - _DAY_S),
                "last_7d": queries.usage_window(conn, name, since=now - 7 * _DAY_S),
                "by_function_saved": queries.saved_by_function(conn, name),
                "misses_by_cause": {"last_24h": queries.misses_by_cause(conn, name, since=now - _DAY_S),
                                    "last_7d": queries.misses_by_cause(conn, name, since=now - 7 * _DAY_S)}}


def changed(state: State, name: str) -> None:
    """Entries of ``name`` changed (rescan, prune, delete): cached statistics and listings' ETags are stale, in
    every process."""
    state.generations.bump(name, ENTRIES)
    refresh_totals(state.metrics, state.catalog, name)


def refresh_totals(metrics: Metrics, catalog: Catalog, name: str) -> None:
    """Set ``name``'s entries and bytes gauges from the catalog."""
    with catalog.session() as s:
        count, size = stats.cache_totals(s, name)
    metrics.entries.labels(name).set(count)
    metrics.bytes.labels(name).set(size)
