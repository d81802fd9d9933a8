"""Hit rate and seconds saved per cache and job, as gauges read from the catalog by a task of the app's lifespan,
before it serves and then every ``JAXCACHE_USAGE_METRICS_S``: a scrape answers the last read, and a failed read
leaves the series absent. Replicas export the same values: aggregate with ``max``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jaxcache.service.background import Outage, describe
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.reports.jobs import queries

log = logging.getLogger("jaxcache.service")

#: The windows of GET /v1/caches/{cache}/stats (``last_24h``, ``last_7d``), by the ``window`` label.
WINDOWS = {"24h": 86400.0, "7d": 7 * 86400.0}
#: Per-job series per cache: the most recently active only, so job names cannot grow the scrape without bound.
MAX_JOBS = 50


@dataclass(frozen=True, slots=True)
class _Answer:
    windows: dict[tuple[str, str], dict[str, Any]]  # (cache, window) -> queries.usage_window
    jobs: dict[str, list[dict[str, Any]]]  # cache -> queries.jobs, newest first


class UsageCollector(Collector):
    """The hit-rate, saved-seconds and lookup gauges of ``caches`` and their jobs, and whether reading them fails."""

    def __init__(self, catalog: Catalog, caches: Sequence[str], *, max_jobs: int = MAX_JOBS) -> None:
        self._catalog, self._caches, self._max_jobs = catalog, list(caches), max_jobs
        self._last: tuple[_Answer | None, bool | None] = (None, None)  # the last read, and whether it failed
        self._outage = Outage()

    def describe(self) -> Iterable[Metric]:
        # What the registry checks names with at registration: no query, no samples.
        return self._families(None, None)

    def collect(self) -> Iterable[Metric]:
        return self._families(*self._last)

    async def refreshing(self, period_s: float, *,
                         task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Read now, then every ``period_s`` until cancelled (a task of the app's lifespan, started once read)."""
        await anyio.to_thread.run_sync(self.refresh)
        task_status.started()
        while True:
            await anyio.sleep(period_s)
            await anyio.to_thread.run_sync(self.refresh)

    def refresh(self) -> None:
        """Read the gauges from the catalog (it blocks: in a thread); a failure is logged once until a read works."""
        try:
            answer = self._compute()
        except Exception as exc:  # noqa: BLE001 - a scrape must never fail: no samples, one line in the log
            self._last = (None, True)
            (log.warning if self._outage.failed() else log.debug)(
                "usage metrics (jaxcache_hit_rate and the like) have no samples: reading the catalog failed: %s",
                describe(exc))
            return
        self._last = (answer, False)
        if self._outage.succeeded():
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
