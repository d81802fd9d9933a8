"""A real `jaxcache serve` with no data yet, in one process and in several (`--workers 2`): every metric family the
shipped dashboard and alert rules query is in `/metrics` from the start, each configured cache's series at 0
where its labels are known then. A counter series that first appears at its first error is never seen to
`increase()`, so an alert or panel on it would miss that error."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from conftest import serve_env, start_serve, stop_serve, wait_ready

PATIENCE_S = 120
DEPLOY = Path(__file__).parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "jaxcache-dashboard.json"
RULES = DEPLOY / "prometheus" / "jaxcache-rules.yml"
METRIC = re.compile(r"\bjaxcache_[a-z0-9_]+\b")
#: The series names a query may use for a family of counters or histograms.
SUFFIXES = ("_total", "_bucket", "_sum", "_count")
CACHES = ("alpha", "beta")
#: Families with no series until what they count has happened: a label value nobody can know before, or no honest
#: value yet (docs/service.md, "Metrics"). Each is still declared from the start.
LATER = {
    "jaxcache_scan_errors": "kind is the type of the error",
    "jaxcache_loop_errors": "kind is the type of the error",
    "jaxcache_hit_rate": "no rate without lookups",
    "jaxcache_job_hit_rate": "a series per job, and no job ran",
    "jaxcache_job_saved_seconds": "a series per job, and no job ran",
    "jaxcache_loop_last_success_timestamp_seconds": "no round has succeeded yet (JaxcacheAbsent waits for one)",
    "jaxcache_request_seconds": "a series per route, from its first request",
}


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def queried() -> dict[str, str]:
    """Each series name the dashboard's and the rules' queries use, with the file that uses it."""
    found: dict[str, str] = {}
    for path, tree in ((DASHBOARD, json.loads(DASHBOARD.read_text())), (RULES, yaml.safe_load(RULES.read_text()))):
        for expr in _exprs(tree):
            for name in METRIC.findall(expr):
                found.setdefault(name, path.name)
    return found


def family_of(name: str, families: set[str]) -> str | None:
    """The exposition's family a query's series name belongs to, if any."""
    if name in families:
        return name
    return next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s) and name.removesuffix(s) in families),
                None)


@pytest.fixture(params=["one process", "two workers"])
def exposition(request, tmp_path) -> dict[str, list[Sample]]:
    """The families of the first `/metrics` once a service over two empty caches is ready, and their samples."""
    caches = {name: tmp_path / name for name in CACHES}
    for root in caches.values():
        root.mkdir()
    args = ("--workers", "2" if request.param == "two workers" else "1")  # the default: as many as CPUs, up to 4
    log = tmp_path / "serve.log"
    proc, base = start_serve(caches, f"sqlite:///{tmp_path / 'catalog.sqlite'}", env=serve_env(), args=args,
                             stdout=log.open("w"))
    try:
        wait_ready(proc, base, output=log.read_text, patience_s=PATIENCE_S)
        text = httpx.get(f"{base}/metrics", timeout=PATIENCE_S).text
    finally:
        stop_serve(proc)
    return {f.name: [s for s in f.samples if not s.name.endswith("_created")]
            for f in text_string_to_metric_families(text)}


def test_the_check_follows_the_shipped_dashboard_and_rules():
    names = queried()
    assert "jaxcache_reports_rejected_total" in names and "jaxcache_scan_seconds_bucket" in names, names
    assert family_of("jaxcache_scan_seconds_bucket", {"jaxcache_scan_seconds"}) == "jaxcache_scan_seconds"
    assert family_of("jaxcache_nope_total", {"jaxcache_scan_seconds"}) is None


@pytest.mark.slow
def test_every_queried_family_is_exported_from_the_start_at_0(exposition):
    families = set(exposition)
    missing = sorted(f"{name} ({where})" for name, where in queried().items() if family_of(name, families) is None)
    assert not missing, f"queried but not in /metrics: {missing}"
    used = {family_of(name, families) for name in queried()}
    empty = sorted(f for f in used if f is not None and f not in LATER and not exposition[f])
    assert not empty, f"queried, and no series from the start: {empty}"
    for family in sorted(f for f in used if f is not None):
        samples = exposition[family]
        with_cache = {s.labels["cache"] for s in samples if "cache" in s.labels}
        assert not with_cache or with_cache == set(CACHES), f"{family}: series for caches {with_cache} only"
        counted = [s for s in samples if s.name.endswith("_total") and s.value != 0]
        assert not counted, f"{family} counted something with no data: {counted}"
