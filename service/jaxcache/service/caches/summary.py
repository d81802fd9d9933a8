"""A configured cache as the API and the dashboard show it: its size and last scan, its statistics and usage (kept
until its entries or usage change, or a minute passes), and its totals' gauges, set again after each change."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Integer, cast, func, select
from sqlalchemy.orm import Session

from jaxcache.service.caches.schemas import CacheSummary, SkippedObject
from jaxcache.service.catalog import usage as queries
from jaxcache.service.catalog import usage as queue
from jaxcache.service.catalog.database import ENTRIES, Catalog
from jaxcache.service.catalog.models import CacheRow, EntryRow
from jaxcache.service.metrics import Metrics
from jaxcache.service.state import State

_DAY_S = 86400.0


def caches(state: State) -> list[CacheSummary]:
    """Every configured cache with its size and last scan."""
    out = []
    waiting = queue.waiting_by_cache(state.catalog)
    with state.catalog.session() as s:
        for name in state.settings.caches:
            row = s.get(CacheRow, name)
            count, size = cache_totals(s, name)
            scan: dict[str, Any] = {} if row is None else dict(
                last_scan_s=row.last_scan_s, last_scan_seconds=row.last_scan_seconds,
                last_scan_error=row.last_scan_error, last_scan_skipped=row.last_scan_skipped,
                last_scan_skipped_names=[SkippedObject(name=str(n.get("name", "")), why=str(n.get("why", "")))
                                         for n in row.last_scan_skipped_names or ()])
            out.append(CacheSummary(name=name, url=state.storages[name].url, entries=count, size_bytes=size,
                                    reports_waiting=waiting.get(name, 0), **scan))
    return out


def cache_totals(s: Session, cache: str, kind: str = "entry") -> tuple[int, int]:
    """(count, bytes) of a cache's ``-cache`` files (or, with ``kind="orphan"``, of its lone ``-atime`` files)."""
    count, size = s.execute(select(func.count(), func.coalesce(func.sum(EntryRow.size_bytes), 0))
                            .where(EntryRow.cache == cache, EntryRow.kind == kind)).one()
    return int(count), int(size)


def stats_of(state: State, name: str) -> dict:
    """Statistics of one cache (its entries and, :func:`usage_of`, its hit rates)."""
    return {**state.computed("stats", name, lambda n: _stats(state, n)), **usage_of(state, name)}


def usage_of(state: State, name: str) -> dict:
    """Hit rate and seconds saved over the last 24 h and 7 d, seconds saved by function, misses by cause."""
    return state.computed("usage", name, lambda n: _usage(state, n))


def _stats(state: State, cache: str) -> dict:
    """Totals, by function, by compression, growth per day, corrupt and orphan counts."""
    base = (EntryRow.cache == cache, EntryRow.kind == "entry")
    with state.catalog.session() as s:
        # One grouped pass over the table; totals, functions and compression are folded from it here.
        groups = s.execute(
            select(EntryRow.module, EntryRow.compression, EntryRow.status, func.count(),
                   func.sum(EntryRow.size_bytes), func.coalesce(func.sum(EntryRow.compile_seconds), 0))
            .where(*base).group_by(EntryRow.module, EntryRow.compression, EntryRow.status)).all()
        orphans, orphan_bytes = cache_totals(s, cache, "orphan")
        now = time.time()
        # Whole days since 1970, rounded down (PostgreSQL's CAST rounds to nearest, hence FLOOR there).
        day = (cast(func.floor(EntryRow.created_s / 86400), BigInteger) if s.get_bind().dialect.name == "postgresql"
               else cast(EntryRow.created_s / 86400, Integer))
        growth_rows = s.execute(select(day, func.count(), func.sum(EntryRow.size_bytes)).where(
            *base, EntryRow.created_s >= now - 30 * _DAY_S).group_by(day).order_by(day)).all()
        first = s.execute(select(func.min(EntryRow.created_s)).where(*base)).scalar()
    count = size = seconds = corrupt = 0
    compression: dict[str, int] = {}
    functions: dict[str, list[int]] = {}
    for module, comp, status, n, b, c in groups:
        n, b, c = int(n), int(b or 0), int(c or 0)
        count, size, seconds = count + n, size + b, seconds + c
        corrupt += n if status == "corrupt" else 0
        compression[comp or "unknown"] = compression.get(comp or "unknown", 0) + n
        f = functions.setdefault(module, [0, 0, 0])
        f[0], f[1], f[2] = f[0] + n, f[1] + b, f[2] + c
    by_fn = sorted(((m, f[0], f[1], f[2]) for m, f in functions.items()), key=lambda t: (-t[2], t[0]))
    week_start = int(now // _DAY_S) - 6
    last_week = sum(int(b) for d, _, b in growth_rows if int(d) >= week_start)
    age_days = 0.0 if first is None else (now - float(first)) / _DAY_S
    # A cache younger than a week is averaged over its own age, and not before its first whole day.
    per_day = (None if age_days < 1 else last_week / 7 if age_days >= 7
               else sum(int(b) for _, _, b in growth_rows) / age_days)
    return {
        "cache": cache, "entries": count, "size_bytes": size, "compile_seconds": seconds, "corrupt": corrupt,
        "orphans": orphans, "orphan_bytes": orphan_bytes, "compression": compression,
        "mixed_compression": compression.get("zstd", 0) > 0 and compression.get("zlib", 0) > 0,
        "by_function": [{"function": m, "entries": n, "size_bytes": b, "compile_seconds": c}
                        for m, n, b, c in by_fn[:100]],
        "functions_total": len(by_fn),
        "growth": [{"day": datetime.fromtimestamp(int(d) * _DAY_S, UTC).date().isoformat(), "entries": int(n),
                    "size_bytes": int(b)} for d, n, b in growth_rows],
        "bytes_per_day": per_day,
        "first_created_s": None if first is None else float(first),
    }


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
        count, size = cache_totals(s, name)
    metrics.entries.labels(name).set(count)
    metrics.bytes.labels(name).set(size)
