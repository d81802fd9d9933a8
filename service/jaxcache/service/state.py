"""What the service's routes, pages and background loops share: one :class:`State` per app."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from cachetools import TTLCache
from sqlalchemy import select, update

from jaxcache.errors import InvalidRootError, JaxcacheError, RootGoneError
from jaxcache.prune import PrunePolicy
from jaxcache.service.auth import Authenticator
from jaxcache.service.catalog import loop_health, queries
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.generations import ENTRIES, USAGE, Generation, Generations
from jaxcache.service.catalog.locks import LockBusyError
from jaxcache.service.catalog.models import CacheRow
from jaxcache.service.ingestion import inbox, routing
from jaxcache.service.ingestion.drain import caches_waiting, drain
from jaxcache.service.metrics import Metrics
from jaxcache.service.settings import ServiceSettings
from jaxcache.service.tasks import prune_audit, pruning, root_change, verification
from jaxcache.service.tasks.health import LoopHealth, LoopStatus
from jaxcache.service.tasks.pruning import PruneLocks
from jaxcache.service.tasks.rescan import RescanResult, rescan
from jaxcache.service.usage_metrics import UsageCollector
from jaxcache.storage import Storage, open_storage

log = logging.getLogger("jaxcache.service")

_STATS_TTL_S = 60.0
#: Threads per process for the reads requests wait on (see State.read).
READ_THREADS = 2
T = TypeVar("T")
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
        self._read_limiter: anyio.CapacityLimiter | None = None  # made in the event loop, at the first read
        # Set by the drain loop (loops.py) where this process runs it: a POST wakes it at once.
        self.inbox_arrived: asyncio.Event | None = None
        # Statistics by (what, cache, change counts, minute): computed again after a change, or once a minute (the
        # growth and usage windows move with the clock).
        self._computed: TTLCache[tuple[str, str, Generation, int], dict] = TTLCache(maxsize=256, ttl=_STATS_TTL_S)
        self._computed_lock = threading.Lock()
        self.roots = routing.roots_by_dir({name: storage.url for name, storage in self.storages.items()})
        self.scanned: set[str] = set()
        self._rounds_done: set[str] = set()  # caches this process has rescanned in a background round
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
                self._refresh_integrity(name)

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

    async def read(self, work: Callable[[], T]) -> T:
        """``work`` (a catalog read a request waits for) in one of :data:`READ_THREADS` threads of this process.
        More threads than that only queued on the interpreter lock: each SQLite step hands it over, and a thread
        back from the database waits for it behind the others (bench/README.md, "Threads for listings")."""
        if self._read_limiter is None:
            self._read_limiter = anyio.CapacityLimiter(READ_THREADS)
        return await anyio.to_thread.run_sync(work, limiter=self._read_limiter)

    def rescan(self, name: str, *, wait_s: float | None = None) -> RescanResult:
        """Rescan one cache (one rescan of a cache at a time in every replica: waits at most ``wait_s`` seconds
        for one running elsewhere, then raises LockBusyError), recording metrics and errors."""
        try:
            result = rescan(self.catalog, name, self.storages[name], wait_s=wait_s,
                            secret=self.settings.attest_secret, retain_s=self.settings.records_retain_s,
                            release_from_entries=self.settings.release_memory_from_entries)
        except LockBusyError:
            raise
        except Exception as exc:
            # Per cache, which the loops' own error count is not: which bucket's scans fail, whatever the cause.
            self.metrics.scan_errors.labels(name, type(exc).__name__).inc()
            if isinstance(exc, JaxcacheError):
                with self.catalog.session() as s:  # a write without a read first: see tasks/rescan.py
                    s.execute(update(CacheRow).where(CacheRow.name == name)
                              .values(last_scan_error=str(exc)[:2000]))
            raise
        self.scanned.add(name)
        self.metrics.scan_seconds.labels(name).observe(result.seconds)
        if result.records_ingested:
            self.metrics.reports_ingested.labels(name, inbox.STORAGE).inc(result.records_ingested)
            self.generations.bump(name, USAGE)  # hits, last use and first writers of listed entries moved
        if result.records_malformed:
            self.metrics.reports_malformed.labels(inbox.STORAGE).inc(result.records_malformed)
        if result.records_compacted:
            self.metrics.records_compacted.labels(name).inc(result.records_compacted)
            self.generations.bump(name, USAGE)  # the usage windows' runs may be gone
        if result.added or result.removed or result.updated:
            self.changed(name)
            self.stats(name)  # computed here, in the scan thread, so this process's requests find it ready
        return result

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
            return queries.stats(s, name)

    def _compute_usage(self, name: str) -> dict:
        now = time.time()
        with self.catalog.reader() as conn:
            return {"last_24h": queries.usage_window(conn, name, since=now - _DAY_S),
                    "last_7d": queries.usage_window(conn, name, since=now - 7 * _DAY_S),
                    "by_function_saved": queries.saved_by_function(conn, name),
                    "misses_by_cause": {"last_24h": queries.misses_by_cause(conn, name, since=now - _DAY_S),
                                        "last_7d": queries.misses_by_cause(conn, name, since=now - 7 * _DAY_S)}}

    def wake_drain(self) -> None:
        """A record entered the inbox: the drain loop of this process (if it runs one) takes it now."""
        if self.inbox_arrived is not None:
            self.inbox_arrived.set()

    def drain_all(self) -> int:
        """Fold what waits in the report inbox, of every cache; the records that changed the catalog."""
        fresh = 0
        for name in caches_waiting(self.catalog):
            self.loops.on_cache(name)
            # Every cache's, configured here or not (another replica's, or one dropped from the settings): rows
            # nobody drains would fill the inbox and refuse every report.
            storage = self.storages.get(name)
            drained = drain(self.catalog, name, secret=self.settings.attest_secret,
                            root=storage.url if storage is not None else None)
            for source, n in drained.fresh.items():
                self.metrics.reports_ingested.labels(name, source).inc(n)
            if drained.malformed:
                self.metrics.reports_malformed.labels(inbox.REPORT).inc(drained.malformed)
            if storage is not None and (drained.fresh or drained.misses):
                self.generations.bump(name, USAGE)  # hits, last use, first writers and misses moved
            fresh += sum(drained.fresh.values())
        return fresh

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
                count, size = queries.cache_totals(s, name)
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

    def prune(self, name: str, policy: PrunePolicy, *, policy_json: dict[str, Any], dry_run: bool,
              who: str) -> pruning.Outcome:
        """Plan (or apply, unless ``dry_run``: the caller checked the admin scope) a prune of ``name``. Raises
        PruneInProgressError while another prune of ``name`` runs."""
        throttle = pruning.Throttle(self.settings.verify_bytes_per_s, self.settings.verify_cpu_share)
        outcome = pruning.run_prune(self.catalog, name, self.storages[name], policy, dry_run=dry_run, who=who,
                                    policy_json=policy_json, lock=self.prune_locks.get(name),
                                    secret=self.settings.attest_secret, throttle=throttle,
                                    retain_s=self.settings.records_retain_s)
        if outcome.result is not None:
            self.metrics.prune_deleted.labels(name).inc(outcome.result.deleted)
            self.metrics.prune_bytes.labels(name).inc(outcome.result.bytes_freed)
            self.changed(name)
        return outcome

    def close_interrupted_prunes(self, name: str) -> None:
        """Close the audit rows of prunes of ``name`` whose replica died mid-way (none runs while we hold the
        cache's prune lock; skipped while one does)."""
        lock = self.prune_locks.get(name)
        if not lock.acquire(blocking=False):
            return
        try:
            closed = prune_audit.close_interrupted(self.catalog, name, self.storages[name])
        finally:
            # Free before the refresh: whoever reads the audit closed may prune at once, and must not be told that
            # a prune is still running.
            lock.release()
        if closed:
            self.changed(name)

    def delete_entry(self, name: str, key: str, *, who: str) -> bool:
        """Delete one entry, audited; False when there was none. Raises PruneInProgressError."""
        deleted = pruning.delete_entry(self.catalog, name, self.storages[name], key, who=who,
                                       lock=self.prune_locks.get(name))
        if deleted:
            self.changed(name)
        return deleted

    def _refresh_gauges(self, name: str) -> None:
        self.metrics.totals(self.catalog, name)

    def verify(self, name: str, *, max_entries: int | None = None, recheck_all: bool = False,
               stop: threading.Event | None = None, throttled: bool = False) -> verification.VerifyPass:
        """One integrity pass over ``name`` (only what needs it unless ``recheck_all``)."""
        if name not in self.scanned:
            self.rescan(name)
        result = verification.run_pass(
            self.catalog, name, self.storages[name], min_age_s=self.settings.verify_min_age_s,
            max_entries=max_entries, recheck_all=recheck_all, stop=stop,
            bytes_per_s=self.settings.verify_bytes_per_s if throttled else None,
            cpu_share=self.settings.verify_cpu_share if throttled else None, progress=self.loops.progress,
        )
        self._refresh_integrity(name)
        return result

    def verify_all(self, stop: threading.Event) -> list[tuple[str, Exception]]:
        """One throttled integrity pass over every cache; the caches whose pass failed, with why."""
        failed: list[tuple[str, Exception]] = []
        for name in self.settings.caches:
            if stop.is_set():
                break
            self.loops.on_cache(name)
            try:
                self.verify(name, stop=stop, throttled=True)
            except Exception as exc:  # noqa: BLE001 - one cache's failure must not stop the others' passes
                failed.append((name, exc))
        return failed

    def _refresh_integrity(self, name: str) -> None:
        self.metrics.integrity_of(self.catalog, name)

    def rescan_all(self) -> list[tuple[str, Exception]]:
        """One round of background rescans; the caches whose rescan failed, with why. With several replicas on one
        catalog, a cache is skipped when another replica is rescanning it or finished a rescan less than half a
        period ago: each replica does not list the whole bucket every period."""
        now = time.time()
        failed: list[tuple[str, Exception]] = []
        with self.catalog.session() as s:
            last = {r.name: r.last_scan_s for r in s.scalars(select(CacheRow))}
        for name in self.settings.caches:
            at = last.get(name)
            # A process's first round always rescans: records and entries written while it was down (or
            # since the last replica's scan) must not wait a whole period.
            if (at is not None and name in self._rounds_done and 0 <= now - at < self.settings.rescan_s / 2):
                log.debug("rescan of %s skipped: scanned %.0f s ago (by another process)", name, now - at)
                continue
            self.loops.on_cache(name)
            try:
                self.rescan(name, wait_s=0)
                self._rounds_done.add(name)
                self.close_interrupted_prunes(name)
            except LockBusyError:
                log.info("rescan of %s skipped: another process is running one", name)
            except Exception as exc:  # noqa: BLE001 - a root or the database gone: the others still get rescanned
                failed.append((name, exc))
        return failed
