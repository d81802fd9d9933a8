"""A configured cache as the API and the dashboard show it: its size and last scan, its statistics (its entries'
figures and the seconds they saved, kept in the catalog: computed once after a change, for every replica) and its
usage windows (kept by each process until it changes or a minute passes), and its totals' gauges, set again after
each change."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from cachetools import LRUCache, TTLCache, cached
from sqlalchemy import BigInteger, Integer, Select, bindparam, cast, func, select
from sqlalchemy.orm import Session

from jaxcache.service.caches.schemas import CacheSummary, ScanState, SkippedObject
from jaxcache.service.catalog import usage
from jaxcache.service.catalog.database import ENTRIES, Catalog, Generation
from jaxcache.service.catalog.models import CacheRow, CacheStatsRow, EntryRow
from jaxcache.service.metrics import Metrics
from jaxcache.service.reachability import Reach
from jaxcache.service.state import State

_DAY_S = 86400.0


def caches(state: State) -> list[CacheSummary]:
    """Every configured cache with its size, last scan, and whether its root answers (this process's last look)."""
    out = []
    waiting = usage.waiting_by_cache(state.catalog)
    with state.catalog.session() as s:
        for name in state.settings.caches:
            row = s.get(CacheRow, name)
            count, size = cache_totals(s, name)
            reach = state.reach.fresh(name)
            scan: dict[str, Any] = {} if row is None else dict(
                last_scan_s=row.last_scan_s, last_scan_seconds=row.last_scan_seconds,
                last_scan_error=row.last_scan_error, last_scan_skipped=row.last_scan_skipped,
                last_scan_skipped_names=[SkippedObject(name=str(n.get("name", "")), why=str(n.get("why", "")))
                                         for n in row.last_scan_skipped_names or ()])
            out.append(CacheSummary(name=name, url=state.storages[name].url, entries=count, size_bytes=size,
                                    reports_waiting=waiting.get(name, 0), scan_state=scan_state(row, reach),
                                    reachable=reach.reachable, unreachable_since_s=reach.since_s,
                                    root_error=reach.error, **scan))
    return out


def scan_state(row: CacheRow | None, reach: Reach) -> ScanState:
    """What ``row``'s figures are (schemas.ScanState): a root that does not answer first, then the last scan's end."""
    if reach.reachable is False:
        return "unreachable"
    if row is not None and row.last_scan_error:
        return "failing"
    return "pending" if row is None or row.last_scan_s is None else "ok"


def scan_state_of(state: State, name: str) -> ScanState:
    """:func:`scan_state` of ``name``, read now."""
    with state.catalog.session() as s:
        return scan_state(s.get(CacheRow, name), state.reach.fresh(name))


def cache_totals(s: Session, cache: str, kind: str = "entry") -> tuple[int, int]:
    """(count, bytes) of a cache's ``-cache`` files (or, with ``kind="orphan"``, of its lone ``-atime`` files)."""
    count, size = s.execute(select(func.count(), func.coalesce(func.sum(EntryRow.size_bytes), 0))
                            .where(EntryRow.cache == cache, EntryRow.kind == kind)).one()
    return int(count), int(size)


def stats_of(state: State, name: str, generation: Generation | None = None) -> dict:
    """Statistics of one cache at its change counts ``generation`` (default: now): its entries' and the compile
    seconds they saved (kept in the catalog, :func:`kept`), and its hit rates (:func:`usage_of`)."""
    generation = generation or state.generations.get(name)
    (computed_s, entries), (_, saved) = kept(state.catalog, name, generation)
    return {**_in_window(computed_s, entries, now=time.time()), **saved, **usage_of(state, name, generation),
            "scan_state": scan_state_of(state, name)}


def kept(catalog: Catalog, name: str, generation: Generation) -> list[tuple[float, dict]]:
    """(when computed, what) of each of :data:`_PARTS` of ``name``'s statistics at ``generation``: as the catalog
    keeps them, else (the usage changed since, or another version of the service changed the entries) computed by
    this process once for those counts. A reader never writes: a page must not wait for the catalog's write lock."""
    with catalog.statements() as conn:
        rows = {r.part: r for r in conn.execute(_kept(), {"cache": name})}
    out = []
    for part, (_, counts_of) in _PARTS.items():
        row = rows.get(part)
        counts = counts_of(generation)
        out.append((row.computed_s, row.stats) if row is not None and row.counts == counts
                   else _computed(catalog, name, part, counts))
    return out


@cached(LRUCache(maxsize=256), lock=threading.Lock(),
        key=lambda catalog, name, part, counts: (catalog.url, name, part, counts))
def _computed(catalog: Catalog, name: str, part: str, counts: str) -> tuple[float, dict]:
    return time.time(), _PARTS[part][0](catalog, name)


def _keep(catalog: Catalog, name: str, part: str, generation: Generation) -> tuple[float, dict]:
    """Compute ``part`` of ``name``'s statistics and keep it under ``generation`` (read before computing: a change
    meanwhile leaves it under the older counts, and the next reader computes it again)."""
    compute, counts_of = _PARTS[part]
    computed_s, stats = time.time(), compute(catalog, name)
    insert = catalog.insert(CacheStatsRow).values(cache=name, part=part, counts=counts_of(generation),
                                                  computed_s=computed_s, stats=stats)
    with catalog.session() as s:  # one statement, a write: no read before it
        s.execute(insert.on_conflict_do_update(
            index_elements=["cache", "part"], set_={c: insert.excluded[c] for c in ("counts", "computed_s", "stats")}))
    return computed_s, stats


def usage_of(state: State, name: str, generation: Generation | None = None) -> dict:
    """Hit rate and seconds saved over the last 24 h and 7 d, and misses by cause."""
    return _usage(state.catalog, name, generation or state.generations.get(name), int(time.time() // _USAGE_S))


#: The usage windows move with the clock: kept a minute at most.
_USAGE_S = 60.0


@cached(TTLCache(maxsize=256, ttl=_USAGE_S), lock=threading.Lock(),
        key=lambda catalog, name, generation, minute: (catalog.url, name, generation, minute))
def _usage(catalog: Catalog, name: str, generation: Generation, minute: int) -> dict:
    """``name``'s usage at change counts ``generation``, in the clock's ``minute``: kept under both (cachetools),
    in this process, for every app in it."""
    now = time.time()
    with catalog.reader() as conn:
        return {"last_24h": usage.usage_window(conn, name, since=now - _DAY_S),
                "last_7d": usage.usage_window(conn, name, since=now - 7 * _DAY_S),
                "misses_by_cause": {"last_24h": usage.misses_by_cause(conn, name, since=now - _DAY_S),
                                    "last_7d": usage.misses_by_cause(conn, name, since=now - 7 * _DAY_S)}}


def _saved(catalog: Catalog, cache: str) -> dict:
    """The functions whose entries (in the cache now) saved the most compile seconds: with the entries and with the
    usage, not with the clock."""
    with catalog.reader() as conn:
        return {"by_function_saved": usage.saved_by_function(conn, cache)}


def _stats(catalog: Catalog, cache: str) -> dict:
    """Totals, by function, by compression, created per day (every day: the growth's window moves with the clock,
    :func:`_in_window`), the oldest creation, corrupt and orphan counts."""
    base = (EntryRow.cache == cache, EntryRow.kind == "entry")
    with catalog.session() as s:
        # One grouped pass over the table; totals, functions and compression are folded from it here.
        groups = s.execute(
            select(EntryRow.module, EntryRow.compression, EntryRow.status, func.count(),
                   func.sum(EntryRow.size_bytes), func.coalesce(func.sum(EntryRow.compile_seconds), 0))
            .where(*base).group_by(EntryRow.module, EntryRow.compression, EntryRow.status)).all()
        orphans, orphan_bytes = cache_totals(s, cache, "orphan")
        # Whole days since 1970, rounded down (PostgreSQL's CAST rounds to nearest, hence FLOOR there).
        day = (cast(func.floor(EntryRow.created_s / 86400), BigInteger) if s.get_bind().dialect.name == "postgresql"
               else cast(EntryRow.created_s / 86400, Integer))
        days = s.execute(select(day, func.count(), func.sum(EntryRow.size_bytes)).where(*base)
                         .group_by(day).order_by(day)).all()
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
    return {
        "cache": cache, "entries": count, "size_bytes": size, "compile_seconds": seconds, "corrupt": corrupt,
        "orphans": orphans, "orphan_bytes": orphan_bytes, "compression": compression,
        "mixed_compression": compression.get("zstd", 0) > 0 and compression.get("zlib", 0) > 0,
        "by_function": [{"function": m, "entries": n, "size_bytes": b, "compile_seconds": c}
                        for m, n, b, c in by_fn[:100]],
        "functions_total": len(by_fn),
        "days": [[int(d), int(n), int(b or 0)] for d, n, b in days],
        "first_created_s": None if first is None else float(first),
    }


def _in_window(computed_s: float, stats: dict, *, now: float) -> dict:
    """``stats`` as answered at ``now``: growth per day over the last 30 days (today's included), and the mean
    bytes a day, over the last 7 days or, for a younger cache, over its age."""
    today = int(now // _DAY_S)
    growth = [(d, n, b) for d, n, b in stats["days"] if d > today - 30]
    first = stats["first_created_s"]
    age_days = 0.0 if first is None else (now - first) / _DAY_S
    # A cache younger than a week is averaged over its own age, and not before its first whole day.
    per_day = (None if age_days < 1 else sum(b for d, _, b in growth if d > today - 7) / 7 if age_days >= 7
               else sum(b for _, _, b in growth) / age_days)
    return {**{k: v for k, v in stats.items() if k != "days"}, "computed_s": computed_s,
            "growth": [{"day": datetime.fromtimestamp(d * _DAY_S, UTC).date().isoformat(), "entries": n,
                        "size_bytes": b} for d, n, b in growth],
            "bytes_per_day": per_day}


def changed(state: State, name: str) -> None:
    """Entries of ``name`` changed (a rescan, which a prune ends with too; a DELETE): listings' ETags and kept
    statistics are stale, in every process, and the totals' gauges are set again. What made the change then calls
    :func:`keep`."""
    state.generations.bump(name, ENTRIES)
    refresh_totals(state.metrics, state.catalog, name)


def keep(state: State, name: str) -> None:
    """Compute ``name``'s statistics at its change counts now and keep them in the catalog: once, by what changed
    the entries, so that no reader waits for them (a DELETE's answer does not either: it runs this after)."""
    generation = state.generations.get(name)
    for part in _PARTS:
        _keep(state.catalog, name, part, generation)


def refresh_totals(metrics: Metrics, catalog: Catalog, name: str) -> None:
    """Set ``name``'s entries and bytes gauges from the catalog."""
    with catalog.session() as s:
        count, size = cache_totals(s, name)
    metrics.entries.labels(name).set(count)
    metrics.bytes.labels(name).set(size)


#: The parts of a cache's statistics the catalog keeps, each with how it is computed and the counts it depends on
#: (kept beside it): the entries' figures change only with the entries, the seconds saved also with the usage.
_PARTS: dict[str, tuple[Callable[[Catalog, str], dict], Callable[[Generation], str]]] = {
    "entries": (_stats, lambda generation: f"{generation.entries:x}"),
    "saved": (_saved, Generation.tag),
}


@functools.cache
def _kept() -> Select:
    # Built once: every answer of the statistics reads it.
    return (select(CacheStatsRow.part, CacheStatsRow.counts, CacheStatsRow.computed_s, CacheStatsRow.stats)
            .where(CacheStatsRow.cache == bindparam("cache")))
