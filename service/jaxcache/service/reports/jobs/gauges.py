"""Hit rate and seconds saved per cache and job, as gauges from the catalog, asked at most every :data:`TTL_S` in a
thread of its own; a failed query leaves the series absent. Replicas export the same values: aggregate with ``max``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jaxcache.service.background import describe
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.reports.jobs import queries

log = logging.getLogger("jaxcache.service")

#: The windows of GET /v1/caches/{cache}/stats (``last_24h``, ``last_7d``), by the ``window`` label.
WINDOWS = {"24h": 86400.0, "7d": 7 * 86400.0}
#: Per-job series per cache: the most recently active only, so job names cannot grow the scrape without bound.
MAX_JOBS = 50
#: Ask the catalog at most this often; the ServiceMonitor scrapes every 30 s too.
TTL_S = 30.0
#: The longest a scrape waits for the first answer (later scrapes answer the previous one at once).
WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class _Answer:
    windows: dict[tuple[str, str], dict[str, Any]]  # (cache, window) -> queries.usage_window
    jobs: dict[str, list[dict[str, Any]]]  # cache -> queries.jobs, newest first


class UsageCollector(Collector):
    """The hit-rate, saved-seconds and lookup gauges of ``caches`` and their jobs, and whether the query fails."""

    def __init__(self, catalog: Catalog, caches: Sequence[str], *, ttl_s: float = TTL_S, wait_s: float = WAIT_S,
                 max_jobs: int = MAX_JOBS, clock: Callable[[], float] = time.monotonic) -> None:
        self._catalog, self._caches = catalog, list(caches)
        self._ttl_s, self._wait_s, self._max_jobs, self._clock = ttl_s, wait_s, max_jobs, clock
        self._lock = threading.Lock()
        self._answer: _Answer | None = None
        self._failing: bool | None = None  # None until the first query ends
        self._asked_at: float | None = None
        self._running: threading.Event | None = None

    def describe(self) -> Iterable[Metric]:
        # What the registry checks names with at registration: no query, no samples.
        return self._families(None, None)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            if self._running is None and (self._asked_at is None or self._clock() - self._asked_at >= self._ttl_s):
                self._asked_at = self._clock()
                self._running = threading.Event()
                threading.Thread(target=self._query, args=(self._running,), name="jaxcache-usage-metrics",
                                 daemon=True).start()
            waiting = self._running if self._answer is None and self._failing is None else None
        if waiting is not None:
            waiting.wait(self._wait_s)
        with self._lock:
            return self._families(self._answer, self._failing)

    def _query(self, done: threading.Event) -> None:
        answer: _Answer | None = None
        error: Exception | None = None
        try:
            answer = self._compute()
        except Exception as exc:  # noqa: BLE001 - a scrape must never fail: no samples, one line in the log
            error = exc
        with self._lock:
            was_failing = self._failing
            self._answer, self._failing, self._running = answer, error is not None, None
        done.set()
        if error is not None:
            # Said once per outage, like the background loops' errors, not every 30 s.
            (log.debug if was_failing else log.warning)(
                "usage metrics (jaxcache_hit_rate and the like) have no samples: reading the catalog failed: %s",
                describe(error))
        elif was_failing:
            log.info("usage metrics recovered: the catalog answers again")

    def _compute(self) -> _Answer:
        now = time.time()
        windows: dict[tuple[str, str], dict[str, Any]] = {}
        jobs: dict[str, list[dict[str, Any]]] = {}
        with self._catalog.reader() as conn:
            for cache in self._caches:
                for window, span in WINDOWS.items():
                    windows[cache, window] = queries.usage_window(conn, cache, since=now - span)
                jobs[cache] = queries.jobs(conn, cache, limit=self._max_jobs)
        return _Answer(windows, jobs)

    @staticmethod
    def _families(answer: _Answer | None, failing: bool | None) -> list[Metric]:
        hit_rate = GaugeMetricFamily(
            "jaxcache_hit_rate", "jobs' hits / (hits + misses) over the window, of the processes whose run records "
            "were updated in it (GET /v1/caches/{cache}/stats last_24h, last_7d); absent without lookups",
            labels=["cache", "window"])
        saved = GaugeMetricFamily(
            "jaxcache_saved_seconds", "compile seconds jobs saved by hits over the window (stats saved_s)",
            labels=["cache", "window"])
        lookups = GaugeMetricFamily(
            "jaxcache_lookups", "jobs' hits + misses over the window: how much the hit rate rests on",
            labels=["cache", "window"])
        job_rate = GaugeMetricFamily(
            "jaxcache_job_hit_rate", f"a job's hit rate over its retained run records (GET .../jobs), for the "
            f"{MAX_JOBS} most recently active jobs of each cache; absent without lookups", labels=["cache", "job"])
        job_saved = GaugeMetricFamily(
            "jaxcache_job_saved_seconds", f"compile seconds a job saved over its retained run records, for the "
            f"{MAX_JOBS} most recently active jobs of each cache", labels=["cache", "job"])
        failing_family = GaugeMetricFamily(
            "jaxcache_usage_metrics_failing", "1 while reading the usage metrics from the catalog fails (they have "
            "no samples then), else 0")
        if answer is not None:
            for (cache, window), usage in answer.windows.items():
                if usage["hit_rate"] is not None:
                    hit_rate.add_metric([cache, window], usage["hit_rate"])
                saved.add_metric([cache, window], usage["saved_s"])
                lookups.add_metric([cache, window], usage["hits"] + usage["misses"])
            for cache, jobs in answer.jobs.items():
                for job in jobs:
                    if job["hit_rate"] is not None:
                        job_rate.add_metric([cache, job["job"]], job["hit_rate"])
                    job_saved.add_metric([cache, job["job"]], job["saved_s"])
        if failing is not None:
            failing_family.add_metric([], 1.0 if failing else 0.0)
        return [hit_rate, saved, lookups, job_rate, job_saved, failing_family]
