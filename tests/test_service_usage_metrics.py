"""The usage collector (jaxcache.service.reports.jobs.gauges): hit rate and compile seconds saved per cache and per
job in /metrics, equal to what the API answers for the same catalog; read by a task of the app's lifespan, before it
serves and then every JAXCACHE_USAGE_METRICS_S, never by a scrape; a failing catalog costs the samples and a log line
per outage, never the scrape. And refused reports counted by reason."""

from __future__ import annotations

import contextlib
import logging
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.exc import OperationalError

from conftest import settled
from jaxcache.service.app import create_app
from jaxcache.service.reports.jobs.gauges import MAX_JOBS, UsageCollector
from reports_support import DAY, H_ADMIN, H_READ, USAGE_S, compiled, hit, post, report, run, scraped, settings, write


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted labels: value} of the samples named ``name`` in an exposition."""
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == name}


def jobs_shown(text: str) -> set[str]:
    return {dict(k)["job"] for k in samples(text, "jaxcache_job_saved_seconds")}


REPORTED = {"pretrain", "finetune", "eval", "old"}


@pytest.fixture
def reported(metered, keys):
    """pretrain wrote train and tiny; finetune (3 days ago) hit train twice; eval (now) hit train and compiled
    tiny; old (10 days ago) hit train once. Each folded before the next is posted; the gauges read after the last."""
    now = time.time()
    train, tiny = keys["jit_train_step"], keys["jit_tiny"]
    report(metered, run("pretrain", "p1", [write(train, 20.0, now - 7200), write(tiny, 1.0, now - 7200)],
                        at=now - 7000))
    report(metered, run("finetune", "f1", [hit(train, 2, now - 3 * DAY)], at=now - 3 * DAY))
    report(metered, run("eval", "e1", [hit(train, 1, now - 100), compiled(tiny, 0.5, now - 100)], at=now - 50))
    report(metered, run("old", "o1", [hit(train, 1, now - 10 * DAY)], at=now - 10 * DAY))
    # A read that shows the last job began after every record was folded: it shows them all.
    return scraped(metered, lambda text: jobs_shown(text) == REPORTED)


def test_cache_gauges_equal_the_stats_route(metered, reported):
    text = reported
    stats = metered.get("/v1/caches/demo/stats", headers=H_READ).json()
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


def test_job_gauges_equal_the_jobs_route(metered, reported):
    text = reported
    listed = {j["job"]: j for j in metered.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"]}
    rate, saved = samples(text, "jaxcache_job_hit_rate"), samples(text, "jaxcache_job_saved_seconds")
    assert {dict(k)["job"] for k in saved} == set(listed) == REPORTED
    for job, j in listed.items():
        labels = (("cache", "demo"), ("job", job))
        assert saved[labels] == pytest.approx(j["saved_s"])
        if j["hit_rate"] is None:
            assert labels not in rate
        else:
            assert rate[labels] == pytest.approx(j["hit_rate"])
    assert saved[(("cache", "demo"), ("job", "finetune"))] > 0


def test_per_job_series_are_bounded_to_the_most_recent_jobs(metered, keys):
    now = time.time()
    train = keys["jit_train_step"]
    for i in range(MAX_JOBS + 5):  # job-0 is the oldest
        report(metered, run(f"job-{i}", f"r{i}", [hit(train, 1, now - 1000 + i)], at=now - 1000 + i))
    newest = f"job-{MAX_JOBS + 4}"
    jobs = jobs_shown(scraped(metered, lambda text: newest in jobs_shown(text)))
    assert jobs == {f"job-{i}" for i in range(5, MAX_JOBS + 5)}


def test_the_lifespan_reads_the_gauges_before_serving_and_again_every_period(tmp_path, cache_copy, keys):
    """The first scrape has the catalog's answer (the app serves once it has read it); a record folded later shows
    within a period, read by the lifespan's task (a scrape reads nothing: the test below)."""
    app = create_app(settings(tmp_path, {"demo": str(cache_copy)}, usage_metrics_s=USAGE_S))
    day = (("cache", "demo"), ("window", "24h"))
    with TestClient(app) as client:
        first = client.get("/metrics").text
        assert samples(first, "jaxcache_usage_metrics_failing") == {(): 0.0}
        assert day in samples(first, "jaxcache_lookups")
        settled(client)  # the first rescan may read record files from the root meanwhile
        report(client, run("late", "l1", [hit(keys["jit_train_step"], 3, time.time())]))
        later = scraped(client, lambda text: "late" in jobs_shown(text))
        usage = client.get("/v1/caches/demo/stats", headers=H_READ).json()["last_24h"]
        assert samples(later, "jaxcache_lookups")[day] == usage["hits"] + usage["misses"] >= 3


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


def test_scrapes_answer_the_last_read_and_an_outage_is_logged_once_then_again_after_recovery(metered, reported,
                                                                                              caplog):
    catalog = CountingCatalog(metered.app.state.jaxcache.catalog)
    collector = UsageCollector(catalog, ["demo"])
    unread = scrape(collector)  # registering describes, and scraping collects: neither reads the catalog
    assert catalog.reads == 0 and not samples(unread, "jaxcache_usage_metrics_failing")
    collector.refresh()
    first = scrape(collector)
    assert scrape(collector) == first and catalog.reads == 1 and samples(first, "jaxcache_hit_rate")

    with caplog.at_level(logging.DEBUG, logger="jaxcache.service"):
        for _ in range(2):  # two outages, each of three failed reads
            catalog.down = True
            for _ in range(3):
                collector.refresh()
            failed = scrape(collector)
            assert not samples(failed, "jaxcache_hit_rate") and not samples(failed, "jaxcache_job_saved_seconds")
            assert "# TYPE jaxcache_hit_rate gauge" in failed  # the family stays: dashboards show "no data"
            assert samples(failed, "jaxcache_usage_metrics_failing") == {(): 1.0}
            catalog.down = False
            collector.refresh()
            assert samples(scrape(collector), "jaxcache_hit_rate") == samples(first, "jaxcache_hit_rate")
            assert samples(scrape(collector), "jaxcache_usage_metrics_failing") == {(): 0.0}
    assert catalog.reads == 1 + 2 * 4
    said = [r for r in caplog.records if "usage metrics" in r.getMessage()]
    warnings = [r for r in said if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("connection refused" in r.getMessage() for r in warnings)  # once an outage
    assert len([r for r in said if "recovered" in r.getMessage()]) == 2
    assert not any(r.exc_info for r in caplog.records)


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
