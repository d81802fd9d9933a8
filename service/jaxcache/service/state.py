"""What the service's routes, pages and background loops share: one :class:`State` per app."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import anyio
from cachetools import TTLCache
from sqlalchemy import select

from jaxcache.errors import InvalidRootError, JaxcacheError, RootGoneError
from jaxcache.service.auth import Authenticator
from jaxcache.service.caches import stats
from jaxcache.service.catalog import loop_health
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.generations import ENTRIES, USAGE, Generation, Generations
from jaxcache.service.catalog.models import CacheRow
from jaxcache.service.health import LoopHealth, LoopStatus
from jaxcache.service.metrics import Metrics
from jaxcache.service.prune.audit import PruneLocks
from jaxcache.service.reports import inbox, misses_queries, root_change, routing, usage_queries
from jaxcache.service.reports.gauges import UsageCollector
from jaxcache.service.settings import ServiceSettings
from jaxcache.storage import Storage, open_storage

log = logging.getLogger("jaxcache.service")

_STATS_TTL_S = 60.0
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


class State:
    """Everything the routes share, built once per app."""

    def __init__(self, settings: ServiceSettings, *, prepared: bool = False) -> None:
        """``prepared``: the serving process already migrated the catalog and registered the caches' roots (a
        worker of ``jaxcache serve --workers``)."""
        self.settings = settings
        self.auth = Authenticator(settings)
        self.catalog = Catalog(settings.catalog_url, migrate=not prepared, snapshot_dir=settings.snapshot_dir)
        self.generations = Generations(self.catalog)
        self.metrics = Metrics()
        self.metrics.register(UsageCollector(self.catalog, list(settings.caches)))
        self.metrics.start(list(settings.caches))
        self.catalog.on_misses = self._count_misses
        self.loops = LoopHealth(self.metrics)
        self.loops.on_change = lambda loop, status: loop_health.publish(self.catalog, loop, asdict(status))
        # A root missing now (a volume not mounted yet) is a scan error to show, not a reason to serve no cache.
        self.storages: dict[str, Storage] = {name: open_storage(url, must_exist=False)
                                             for name, url in settings.caches.items()}
        self.prune_locks = PruneLocks(self.catalog.locks)
        # Reports are parsed and stored one at a time in the framework's pool (reports/route.py).
        self.report_limiter = anyio.CapacityLimiter(1)
        # Set by the drain loop (background.py) where this process runs it: a POST wakes it at once.
        self.inbox_arrived: threading.Event | None = None
        # Statistics by (what, cache, change counts, minute): computed again after a change, or once a minute (the
        # growth and usage windows move with the clock).
        self._computed: TTLCache[tuple[str, str, Generation, int], dict] = TTLCache(maxsize=256, ttl=_STATS_TTL_S)
        self._computed_lock = threading.Lock()
        self.roots = routing.roots_by_dir({name: storage.url for name, storage in self.storages.items()})
        self.scanned: set[str] = set()
        self.rounds_done: set[str] = set()  # caches this process has rescanned in a background round
        self.background_rounds = 0  # rounds of background rescans finished (or failed) since start
        # The caches whose root changed since the catalog last served them (`jaxcache serve` says so at start).
        self.root_changes = [] if prepared else root_change.register(
            self.catalog, {name: storage.url for name, storage in self.storages.items()}, settings.root_changed)
        if not prepared:  # a client's tag from before (another catalog at this URL, a rebuilt one) is stale
            for name in settings.caches:
                self.generations.bump(name, ENTRIES, USAGE)
        self.follow()
        self._refuse_unknown_missing_roots()
        if settings.role != "api":  # the catalog's gauges from the start, where the loops keep them fresh
            for name in settings.caches:
                self._refresh_gauges(name)
                self.refresh_integrity(name)

    def _refuse_unknown_missing_roots(self) -> None:
        # A root the catalog has scanned before and that is gone now (an unmounted volume) is served from its rows
        # and reported as a scan error until it is back; one it has never seen is most likely a typo.
        for name, storage in self.storages.items():
            if name in self.scanned:
                continue
            try:
                storage.ping()
            except RootGoneError:
                raise InvalidRootError(f"cache {name!r}: {storage.url} does not exist or is not a directory: check"
                                       " the path, or run a JAX job with jax_compilation_cache_dir pointing there"
                                       " first") from None
            except JaxcacheError:
                pass  # unreachable now (GCS, permissions): a scan error to show, not a reason not to start

    def follow(self) -> None:
        """Caches another process or replica has scanned (or that the catalog kept over a restart) count as
        scanned here: ready."""
        with self.catalog.session() as s:
            for row in s.scalars(select(CacheRow).where(CacheRow.name.in_(list(self.settings.caches)))):
                if row.last_scan_s is not None:
                    self.scanned.add(row.name)

    def changed(self, name: str) -> None:
        """Entries of ``name`` changed (rescan, prune, delete): cached statistics and listings' ETags are stale, in
        every process."""
        self.generations.bump(name, ENTRIES)
        self._refresh_gauges(name)

    def stats(self, name: str) -> dict:
        """Statistics of one cache (its entries and, :meth:`usage`, its hit rates)."""
        return {**self._computed_at("stats", name, self._compute_stats), **self.usage(name)}

    def usage(self, name: str) -> dict:
        """Hit rate and seconds saved over the last 24 h and 7 d, seconds saved by function, misses by cause."""
        return self._computed_at("usage", name, self._compute_usage)

    def _computed_at(self, what: str, name: str, compute: Callable[[str], dict]) -> dict:
        # The counts are read before computing: a change meanwhile leaves the value filed under the old ones.
        key = (what, name, self.generations.get(name), int(time.time() // _STATS_TTL_S))
        with self._computed_lock:
            found = self._computed.get(key)
        if found is None:
            found = compute(name)
            with self._computed_lock:
                self._computed[key] = found
        return found

    def _compute_stats(self, name: str) -> dict:
        with self.catalog.session() as s:
            return stats.stats(s, name)

    def _compute_usage(self, name: str) -> dict:
        now = time.time()
        with self.catalog.reader() as conn:
            return {"last_24h": usage_queries.usage_window(conn, name, since=now - _DAY_S),
                    "last_7d": usage_queries.usage_window(conn, name, since=now - 7 * _DAY_S),
                    "by_function_saved": usage_queries.saved_by_function(conn, name),
                    "misses_by_cause": {"last_24h": misses_queries.misses_by_cause(conn, name, since=now - _DAY_S),
                                        "last_7d": misses_queries.misses_by_cause(conn, name, since=now - 7 * _DAY_S)}}

    def wake_drain(self) -> None:
        """A record entered the inbox: the drain loop of this process (if it runs one) takes it now."""
        if self.inbox_arrived is not None:
            self.inbox_arrived.set()

    def loop_snapshot(self) -> dict[str, LoopStatus]:
        """How the background loops are doing, whichever process runs them (the catalog's ``loop_health``); this
        process's own view while the catalog cannot be read."""
        try:
            published = loop_health.read(self.catalog)
        except Exception:  # noqa: BLE001 - the catalog is away: /readyz says so, and shows what this process knows
            return self.loops.snapshot()
        return {**self.loops.snapshot(), **{loop: LoopStatus.from_dict(status) for loop, status in published.items()}}

    def _count_misses(self, name: str, counts: Mapping[str, int]) -> None:
        for cause, n in counts.items():
            self.metrics.misses.labels(name, cause).inc(n)

    def caches(self) -> list[CacheInfo]:
        """Every configured cache with its size and last scan."""
        out = []
        waiting = inbox.waiting_by_cache(self.catalog)
        with self.catalog.session() as s:
            for name in self.settings.caches:
                row = s.get(CacheRow, name)
                count, size = stats.cache_totals(s, name)
                out.append(CacheInfo(
                    name=name, url=self.storages[name].url, entries=count, size_bytes=size,
                    last_scan_s=row.last_scan_s if row else None,
                    last_scan_seconds=row.last_scan_seconds if row else None,
                    last_scan_error=row.last_scan_error if row else None,
                    reports_waiting=waiting.get(name, 0),
                    last_scan_skipped=row.last_scan_skipped if row else None,
                    last_scan_skipped_names=tuple(SkippedName(str(n.get("name", "")), str(n.get("why", "")))
                                                  for n in (row.last_scan_skipped_names if row else None) or ()),
                ))
        return out

    def _refresh_gauges(self, name: str) -> None:
        self.metrics.totals(self.catalog, name)

    def refresh_integrity(self, name: str) -> None:
        """The integrity gauges of ``name`` from the catalog's verdicts."""
        self.metrics.integrity_of(self.catalog, name)
