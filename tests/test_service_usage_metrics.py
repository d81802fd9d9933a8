"""The usage collector (jaxcache.service.reports.jobs.gauges): hit rate and compile seconds saved per cache and per
job in /metrics, equal to what the API answers for the same catalog; the catalog asked at most once per TTL; a failing
catalog costs the samples and a log line, never the scrape. And refused reports counted by reason."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.exc import OperationalError

from jaxcache.service.reports.jobs.gauges import MAX_JOBS, UsageCollector
from reports_support import DAY, H_ADMIN, H_READ, compiled, hit, post, report, run, write


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted labels: value} of the samples named ``name`` in an exposition."""
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == name}


@pytest.fixture
def reported(svc, keys):
    """pretrain wrote train and tiny; finetune (3 days ago) hit train twice; eval (now) hit train and compiled
    tiny; old (10 days ago) hit train once. Posted before the first scrape, so the first answer has them all."""
    now = time.time()
    train, tiny = keys["jit_train_step"], keys["jit_tiny"]
    report(svc, run("pretrain", "p1", [write(train, 20.0, now - 7200), write(tiny, 1.0, now - 7200)], at=now - 7000))
    report(svc, run("finetune", "f1", [hit(train, 2, now - 3 * DAY)], at=now - 3 * DAY))
    report(svc, run("eval", "e1", [hit(train, 1, now - 100), compiled(tiny, 0.5, now - 100)], at=now - 50))
    report(svc, run("old", "o1", [hit(train, 1, now - 10 * DAY)], at=now - 10 * DAY))
    return now


def test_cache_gauges_equal_the_stats_route(svc, reported):
    text = svc.get("/metrics").text
    stats = svc.get("/v1/caches/demo/stats", headers=H_READ).json()
    rate, saved, lookups = (samples(text, n) for n in ("jaxcache_hit_rate", "jaxcache_saved_seconds",
                                                        "jaxcache_lookups"))
    for window, field in (("24h", "last_24h"), ("7d", "last_7d")):
        labels = (("cache", "demo"), ("window", window))
        usage = stats[field]
        assert usage["hits"] + usage["misses"] > 0
        assert rate[labels] == pytest.approx(usage["hit_rate"])
        assert saved[labels] == pytest.approx(usage["saved_s"])
        assert lookups[labels] == usage["hits"] + usage["misses"]
    assert rate[(("cache", "demo"), ("window", "24h"))] != rate[(("cache", "demo"), ("window", "7d"))]
    assert samples(text, "jaxcache_usage_metrics_failing") == {(): 0.0}


def test_job_gauges_equal_the_jobs_route(svc, reported):
    text = svc.get("/metrics").text
    listed = {j["job"]: j for j in svc.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"]}
    rate, saved = samples(text, "jaxcache_job_hit_rate"), samples(text, "jaxcache_job_saved_seconds")
    assert {dict(k)["job"] for k in saved} == set(listed) == {"pretrain", "finetune", "eval", "old"}
    for job, j in listed.items():
        labels = (("cache", "demo"), ("job", job))
        assert saved[labels] == pytest.approx(j["saved_s"])
        if j["hit_rate"] is None:
            assert labels not in rate
        else:
            assert rate[labels] == pytest.approx(j["hit_rate"])
    assert saved[(("cache", "demo"), ("job", "finetune"))] > 0


def test_per_job_series_are_bounded_to_the_most_recent_jobs(svc, keys):
    now = time.time()
    train = keys["jit_train_step"]
    for i in range(MAX_JOBS + 5):  # job-0 is the oldest
        report(svc, run(f"job-{i}", f"r{i}", [hit(train, 1, now - 1000 + i)], at=now - 1000 + i))
    jobs = {dict(k)["job"] for k in samples(svc.get("/metrics").text, "jaxcache_job_saved_seconds")}
    assert jobs == {f"job-{i}" for i in range(5, MAX_JOBS + 5)}


class CountingCatalog:
    """A catalog whose reader counts its uses, and fails while ``down``."""

    def __init__(self, catalog) -> None:
        self.catalog, self.reads, self.down = catalog, 0, False

    @contextlib.contextmanager
    def reader(self):
        self.reads += 1
        if self.down:
            raise OperationalError("SELECT 1", {}, Exception("connection refused"))
        with self.catalog.reader() as conn:
            yield conn


def scrape(collector: UsageCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def settle(collector: UsageCollector) -> None:
    """Wait for a query the last scrape started (a scrape waits only for the very first one)."""
    deadline = time.monotonic() + 10
    while collector._running is not None and time.monotonic() < deadline:
        time.sleep(0.01)


def test_catalog_asked_at_most_once_per_ttl_and_failures_give_no_samples(svc, reported, caplog):
    state = svc.app.state.jaxcache
    catalog, now = CountingCatalog(state.catalog), [0.0]
    collector = UsageCollector(catalog, ["demo"], ttl_s=30.0, clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(collector)  # registering describes, which must not read the catalog
    assert catalog.reads == 0

    first = scrape(collector)
    assert catalog.reads == 1 and samples(first, "jaxcache_hit_rate")
    now[0] = 29.0
    assert scrape(collector) == first and catalog.reads == 1  # within the TTL: the cached answer

    catalog.down = True
    now[0] = 30.0
    with caplog.at_level(logging.DEBUG, logger="jaxcache.service"):
        scrape(collector)  # starts the refresh; answers the previous result meanwhile
        settle(collector)
        failed = scrape(collector)
        now[0] = 61.0
        scrape(collector)
        settle(collector)
    assert catalog.reads == 3
    assert not samples(failed, "jaxcache_hit_rate") and not samples(failed, "jaxcache_job_saved_seconds")
    assert "# TYPE jaxcache_hit_rate gauge" in failed  # the family stays: dashboards show "no data", not an error
    assert samples(failed, "jaxcache_usage_metrics_failing") == {(): 1.0}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "usage metrics" in r.message]
    assert len(warnings) == 1 and "connection refused" in warnings[0].message  # once per outage
    assert not any(r.exc_info for r in caplog.records)

    catalog.down = False
    now[0] = 92.0
    scrape(collector)
    settle(collector)
    assert samples(scrape(collector), "jaxcache_hit_rate") == samples(first, "jaxcache_hit_rate")
    assert samples(scrape(collector), "jaxcache_usage_metrics_failing") == {(): 0.0}


def test_a_slow_catalog_holds_the_first_scrape_only_briefly(svc):
    """The catalog answers only once the first scrape has returned: a scrape that waited for it would come back
    with its samples (after the bound on the wait below), not without them."""
    answer = threading.Event()

    class Slow(CountingCatalog):
        @contextlib.contextmanager
        def reader(self):
            answer.wait(60)
            with super().reader() as conn:
                yield conn

    collector = UsageCollector(Slow(svc.app.state.jaxcache.catalog), ["demo"], wait_s=0.2)
    text = scrape(collector)
    answer.set()
    assert not samples(text, "jaxcache_saved_seconds")
    settle(collector)
    assert samples(scrape(collector), "jaxcache_saved_seconds")


def test_refused_reports_are_counted_by_reason(svc, keys):
    ok = run("j", "r1", [hit(keys["jit_train_step"], 1, time.time())])
    assert post(svc, ok, "?cache=demo").status_code == 202
    assert post(svc, b"{}", "?cache=demo").status_code == 422
    assert post(svc, ok, "?cache=demo", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert post(svc, ok, "?cache=demo", headers=H_READ).status_code == 403
    assert post(svc, ok, "?cache=nope").status_code == 404
    assert svc.post("/v1/reports?cache=demo", content=b"x" * (svc.app.state.jaxcache.settings.max_report_bytes + 1),
                    headers=H_ADMIN).status_code == 413
    counted = samples(svc.get("/metrics").text, "jaxcache_reports_rejected_total")
    assert counted == {(("reason", r),): 1.0
                       for r in ("malformed", "unauthenticated", "forbidden", "unknown_cache", "too_large")} | {
        (("reason", r),): 0.0 for r in ("error", "other")}  # every reason's series exists from the start
