"""Prometheus metrics in a registry per app; under ``--workers`` every worker writes to PROMETHEUS_MULTIPROC_DIR
and any /metrics sums them. Known series start at 0, as one first seen at its first error never ``increase()``s."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from jaxcache.explain.causes import CAUSES

#: A gauge across worker processes: what the last worker to set it saw (the catalog's totals, a loop's status).
LAST: Final = "mostrecent"
#: ``jaxcache_reports_rejected_total{reason}`` by response status; other 5xx are "error", other 4xx "other".
REJECTIONS: Final = {400: "malformed", 401: "unauthenticated", 403: "forbidden", 404: "unknown_cache",
                     413: "too_large", 422: "malformed"}
#: Every ``reason`` :func:`rejection` answers.
REASONS: Final = (*dict.fromkeys(REJECTIONS.values()), "error", "other")
#: Where a run record came from (runs.source, inbox rows, the ``source`` label): read from its file by a rescan, or
#: POSTed.
STORAGE: Final = "storage"
REPORT: Final = "report"
SOURCES: Final = (STORAGE, REPORT)


def rejection(status: int) -> str:
    """The ``reason`` label of a refused report answered with ``status``."""
    return REJECTIONS.get(status, "error" if status >= 500 else "other")


class Metrics:
    def __init__(self, caches: Sequence[str]) -> None:
        self.registry = CollectorRegistry()
        self._own: list[Collector] = []  # collectors kept in no multiprocess file: each process asks its own
        self._every_worker: CollectorRegistry | None = None
        counter, histogram = partial(Counter, registry=self.registry), partial(Histogram, registry=self.registry)
        gauge = partial(Gauge, registry=self.registry, multiprocess_mode=LAST)
        self.entries = gauge("jaxcache_entries", "entries in the catalog", ["cache"])
        self.bytes = gauge("jaxcache_bytes", "bytes of -cache files in the catalog", ["cache"])
        self.scan_seconds = histogram("jaxcache_scan_seconds", "duration of a rescan", ["cache"])
        self.scan_errors = counter("jaxcache_scan_errors", "rescans of a cache that failed, by error kind",
                                   ["cache", "kind"])
        self.prune_deleted = counter("jaxcache_prune_deleted_entries", "entries deleted by applied prunes", ["cache"])
        self.prune_bytes = counter("jaxcache_prune_deleted_bytes", "bytes freed by applied prunes", ["cache"])
        self.reports_ingested = counter("jaxcache_reports_ingested", "run records ingested (changed the catalog)",
                                        ["cache", "source"])
        self.records_compacted = counter("jaxcache_records_compacted", "run records (processes) older than the "
                                         "retention folded into per-key history", ["cache"])
        self.integrity = gauge("jaxcache_integrity_entries", "entries by last integrity verdict", ["cache", "class"])
        self.misses = counter("jaxcache_misses", "jobs' misses, each counted once when first explained, by cause "
                              "(jaxcache.explain.CAUSES)", ["cache", "cause"])
        self.reports_malformed = counter("jaxcache_reports_malformed", "run records rejected as malformed", ["source"])
        self.reports_rejected = counter("jaxcache_reports_rejected", "POST /v1/reports answered with an error, by "
                                        "reason (from the status: unauthenticated, forbidden, unknown_cache, "
                                        "too_large, malformed, error, other)", ["reason"])
        self.loop_last_success = gauge("jaxcache_loop_last_success_timestamp_seconds",
                                       "when a background loop (rescan, verify) last finished a round without error",
                                       ["loop"])
        self.loop_failing = gauge("jaxcache_loop_failing", "1 while a background loop's rounds fail, else 0", ["loop"])
        self.loop_stuck = gauge("jaxcache_loop_stuck", "1 while a background loop's pass has run past its bound (3 "
                                "of its periods, at least 10 min, or JAXCACHE_STUCK_AFTER_S), else 0", ["loop"])
        self.loop_errors = counter("jaxcache_loop_errors", "failed rounds (or caches in a round) of background loops",
                                   ["loop", "kind"])
        self.request_seconds = histogram("jaxcache_request_seconds", "HTTP request latency", ["route", "method"])
        # Every series whose label values are known, at 0; error kinds, jobs, routes and loops come later.
        for cache in caches:
            for metric in (self.scan_seconds, self.prune_deleted, self.prune_bytes, self.records_compacted):
                metric.labels(cache)
            for source in SOURCES:
                self.reports_ingested.labels(cache, source)
            for cause in CAUSES:
                self.misses.labels(cache, cause)
        for source in SOURCES:
            self.reports_malformed.labels(source)
        for reason in REASONS:
            self.reports_rejected.labels(reason)

    def register(self, collector: Collector) -> None:
        """Add a collector that reads what it exports when scraped (kept in no file: every worker exports it)."""
        self.registry.register(collector)
        self._own.append(collector)

    def start_loops(self, loops: Iterable[str]) -> None:
        """The background ``loops`` this process runs, neither failing nor stuck; no last success (0 reads as 1970)."""
        for loop in loops:
            self.loop_failing.labels(loop).set(0)
            self.loop_stuck.labels(loop).set(0)

    def render(self) -> bytes:
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return generate_latest(self.registry)
        if self._every_worker is None:
            self._every_worker = CollectorRegistry()
            wrappers = [m for m in vars(self).values() if isinstance(m, MetricWrapperBase)]
            self._every_worker.register(_EveryWorker(wrappers, self._own))
        return generate_latest(self._every_worker)


class _EveryWorker(Collector):
    """The workers' files added up, every family declared even before a worker wrote it, and this process's own."""

    def __init__(self, declared: list[MetricWrapperBase], own: list[Collector]) -> None:
        self._files = MultiProcessCollector(None)
        self._declared, self._own = declared, own

    def collect(self) -> Iterable[Metric]:
        found = {m.name: m for m in self._files.collect()}
        for wrapper in self._declared:
            for empty in wrapper.describe():
                yield found.pop(empty.name, empty)
        yield from found.values()  # a family this version no longer declares, left by an older worker
        for collector in self._own:
            yield from collector.collect()
