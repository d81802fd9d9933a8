"""deploy/'s monitoring: the alerting rules (promtool's syntax check and unit tests, the PrometheusRule the same as the
plain rules file), the Grafana dashboard (valid, every panel with a data source and a title), every metric either
queries is one the real service exports, and the monitoring component's ServiceMonitor finds the Service."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deploy_support import DEPLOY, K8S, KUSTOMIZATIONS, by_kind, load_docs, one
from reports_support import H_ADMIN, compiled, hit, report, run, scraped

RULES = DEPLOY / "prometheus" / "jaxcache-rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "jaxcache-rules.test.yml"
MONITORING = K8S / "monitoring"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = DEPLOY / "grafana" / "jaxcache-dashboard.json"
SEVERITIES = {"warning", "critical"}
#: The names a query may use for a family of each type (prometheus_client's exposition: a counter's samples end
#: in _total, a histogram's in _bucket, _sum and _count; both also have _created).
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "unknown": ("",)}
METRIC = re.compile(r"\bjaxcache_[a-z_]+\b")


@pytest.fixture(scope="module")
def promtool() -> str:
    for found in (os.environ.get("JAXCACHE_PROMTOOL"), shutil.which("promtool"), "/usr/bin/promtool"):
        if found and Path(found).is_file():
            return found
    pytest.skip("promtool is not installed: `make test` installs Debian's prometheus package (which has it) as root "
                "or with sudo; or point JAXCACHE_PROMTOOL at one")


def _promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=120)


def rules_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def alerts() -> list[dict]:
    return [r for g in rules_groups() for r in g["rules"] if "alert" in r]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict) -> list[dict]:
    out = []
    for p in board["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row holds its panels
    return out


def dashboard_queries(board: dict) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables' queries."""
    found = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            found.append(query["query"] if isinstance(query, dict) else query)
    return found


def grafana_to_promql(expr: str) -> str:
    """``expr`` with Grafana's variables and its label_values() replaced by what Prometheus accepts."""
    expr = re.sub(r"^label_values\((.+),\s*\w+\)$", r"\1", expr.strip())
    return (expr.replace("$__rate_interval", "5m").replace("$__range", "1d").replace("$__interval", "1m")
            .replace("$cache", ".*"))


# --------------------------------------------------------------------------------------------------------------
# Alerting rules


def test_rule_files_pass_promtool_check(promtool, tmp_path):
    spec = tmp_path / "prometheusrule-spec.yml"
    spec.write_text(yaml.safe_dump({"groups": plain_rule()["spec"]["groups"]}))
    for path, shown in ((RULES, "deploy/prometheus/jaxcache-rules.yml"),
                        (spec, "deploy/k8s/monitoring/prometheusrule.yaml (its spec)")):
        proc = _promtool(promtool, "check", "rules", path)
        assert proc.returncode == 0, f"promtool check rules {shown}:\n{proc.stdout}{proc.stderr}"


def test_rules_unit_tests_pass(promtool):
    proc = _promtool(promtool, "test", "rules", RULES_TEST)
    assert proc.returncode == 0, f"promtool test rules {RULES_TEST.name}:\n{proc.stdout}{proc.stderr}"
    fired = {case["alertname"] for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
             for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert {"JaxcacheHitRateLow", "JaxcacheEntriesCorrupt", "JaxcacheEntriesTampered"} <= fired
    untested = {a["alert"] for a in alerts()} - fired
    assert not untested, f"no unit test in {RULES_TEST.name} makes these alerts fire: {sorted(untested)}"


def plain_rule() -> dict:
    return one(load_docs(PROMETHEUS_RULE.read_text()), "PrometheusRule")


def test_prometheusrule_holds_the_same_rules_as_the_plain_file():
    ours, theirs = rules_groups(), plain_rule()["spec"]["groups"]
    by_name = {r.get("alert") or r.get("record"): r for g in ours for r in g["rules"]}
    differ = [name for g in theirs for r in g["rules"]
              if by_name.get(name := r.get("alert") or r.get("record")) != r]
    missing = set(by_name) - {r.get("alert") or r.get("record") for g in theirs for r in g["rules"]}
    assert ours == theirs, (
        "deploy/k8s/monitoring/prometheusrule.yaml and deploy/prometheus/jaxcache-rules.yml must hold the same "
        f"groups and rules: they differ in {sorted(differ)}, and the PrometheusRule lacks {sorted(missing)} "
        "(edit both, or put the rules file's groups under the PrometheusRule's spec)"
    )


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alerts_say_how_bad_and_what_to_do(alert):
    assert alert.get("for"), f"{alert['alert']}: give it a `for:` so one bad scrape does not page"
    assert alert["labels"]["severity"] in SEVERITIES
    notes = alert["annotations"]
    assert notes.get("summary") and len(notes.get("description", "")) > 80, (
        f"{alert['alert']}: the on-call needs a summary and a description saying where to look and what to do"
    )


# --------------------------------------------------------------------------------------------------------------
# Dashboard


def test_dashboard_is_importable_with_a_datasource_and_a_cache_variable():
    board = dashboard()  # valid JSON, or this raises
    assert board["id"] is None and board["uid"] and board["title"], "importable: no id, a stable uid, a title"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    cache = variables["cache"]
    assert cache["type"] == "query" and cache["datasource"]["uid"] == "${datasource}"
    assert cache["multi"] and cache["includeAll"]
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels(board):
        where = f"panel {p.get('id')} {p.get('title')!r}"
        assert p.get("title"), f"{where}: give it a title"
        assert p.get("datasource", {}).get("uid") == "${datasource}", f"{where}: use the $datasource variable"
        if p["type"] != "row":
            assert p.get("targets"), f"{where}: queries nothing"
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), where
            assert all('cache=~"$cache"' in t["expr"] for t in p["targets"]
                       if re.search(r"\{[^}]*cache", t["expr"])), f"{where}: filter by $cache, not a fixed cache"


def test_dashboard_covers_what_operators_of_a_fleet_look_at():
    queried = {m for expr in dashboard_queries(dashboard()) for m in METRIC.findall(expr)}
    for name in ("jaxcache_hit_rate", "jaxcache_saved_seconds", "jaxcache_job_hit_rate", "jaxcache_job_saved_seconds",
                 "jaxcache_misses_total", "jaxcache_bytes", "jaxcache_entries", "jaxcache_prune_deleted_entries_total",
                 "jaxcache_integrity_entries", "jaxcache_loop_errors_total", "jaxcache_loop_stuck",
                 "jaxcache_scan_errors_total",
                 "jaxcache_scan_seconds_bucket",
                 "jaxcache_reports_ingested_total", "jaxcache_reports_malformed_total",
                 "jaxcache_reports_rejected_total"):
        assert name in queried, f"the dashboard has no panel over {name}"


def test_dashboard_queries_parse_as_promql(promtool, tmp_path):
    # promtool has no expression checker: each query becomes a recording rule, which `check rules` parses.
    rules = [{"record": f"jaxcache:dashboard_query_{i}", "expr": grafana_to_promql(expr)}
             for i, expr in enumerate(dashboard_queries(dashboard()))]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = _promtool(promtool, "check", "rules", path)
    assert proc.returncode == 0, f"a dashboard query is not PromQL:\n{proc.stdout}{proc.stderr}\n" + "\n".join(
        f"{r['record']}: {r['expr']}" for r in rules)


# --------------------------------------------------------------------------------------------------------------
# Every metric the dashboard and the rules query exists


def exported_names(text: str) -> set[str]:
    """The series names a query can use against this exposition."""
    return {family.name + suffix for family in text_string_to_metric_families(text)
            for suffix in SUFFIXES.get(family.type, ("",))}


def unknown(queries: list[str], exported: set[str]) -> list[str]:
    return sorted({name for q in queries for name in METRIC.findall(q)} - exported)


@pytest.fixture
def exported(metered, keys) -> set[str]:
    """What the real service exports after a rescan (the fixture's), a POSTed report with a hit and a miss, and an
    integrity pass: every family, most with labelled series (the usage gauges once read after the report)."""
    now = time.time()
    report(metered, run("metrics-job", "m1", [hit(keys["jit_train_step"], 2, now),
                                              compiled(keys["jit_tiny"], 1.0, now)]))
    assert metered.post("/v1/caches/demo/verify", headers=H_ADMIN).status_code == 200
    text = scraped(metered, lambda text: 'jaxcache_job_hit_rate{cache="demo",job="metrics-job"}' in text)
    assert "jaxcache_misses_total{" in text and 'jaxcache_integrity_entries{cache="demo",class="ok"}' in text
    return exported_names(text)


def test_the_name_check_catches_what_does_not_exist(exported):
    assert unknown(['rate(jaxcache_nope_total[5m])', 'jaxcache_entries'], exported) == ["jaxcache_nope_total"]
    # A counter is queried by its _total series, a histogram by its _bucket/_sum/_count: the bare names have none.
    assert unknown(["jaxcache_misses", "jaxcache_scan_seconds", "jaxcache_entries_total"], exported) == [
        "jaxcache_entries_total", "jaxcache_misses", "jaxcache_scan_seconds"]


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_queried_metric_is_exported_by_the_service(exported, source):
    if source == "dashboard":
        queries, where = dashboard_queries(dashboard()), "deploy/grafana/jaxcache-dashboard.json"
    else:
        queries, where = [a["expr"] for a in alerts()], "deploy/prometheus/jaxcache-rules.yml"
    assert {m for q in queries for m in METRIC.findall(q)}, f"{where} queries no jaxcache_* metric"
    missing = unknown(queries, exported)
    assert not missing, (
        f"{where} queries metrics the service does not export: {missing} (exported: "
        f"{sorted(n for n in exported if not n.endswith('_created'))})"
    )


# --------------------------------------------------------------------------------------------------------------
# The monitoring component


@pytest.fixture(scope="module")
def monitored(tmp_path_factory) -> dict[str, list[dict]]:
    """Each of deploy/k8s's kustomizations with the monitoring component added, as an operator's overlay does."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: install kubectl (it bundles kustomize) to render deploy/k8s")
    out = {}
    for name in KUSTOMIZATIONS:
        folder = tmp_path_factory.mktemp(name.replace("/", "-") + "-monitored")
        (folder / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(K8S / name, folder)],
            "components": [os.path.relpath(MONITORING, folder)],
        }))
        proc = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"deploy/k8s/{name} with the monitoring component does not build:\n{proc.stderr}"
        out[name] = load_docs(proc.stdout)
    return out


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_base_and_overlays_need_no_operator(rendered, name):
    kinds = {d["apiVersion"].split("/")[0] for d in rendered[name]}
    assert "monitoring.coreos.com" not in kinds, f"deploy/k8s/{name} must build for clusters without the Operator"


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    """A LabelSelector's matchLabels and matchExpressions (In only, all the ServiceMonitor uses) against labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", f"teach _selects the operator {e['operator']}"
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_service_monitor_selects_the_service_and_its_port(monitored, rendered, name):
    docs = monitored[name]
    monitor = one(docs, "ServiceMonitor")
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    namespace = monitor["metadata"].get("namespace")
    assert namespace == services["jaxcache"]["metadata"]["namespace"], (
        "the ServiceMonitor must sit in the Service's namespace (it looks only there without a namespaceSelector)")
    wanted = monitor["spec"]["selector"]
    matched = sorted(n for n, s in services.items()
                     if s["metadata"].get("namespace") == namespace and _selects(wanted, s["metadata"]["labels"]))
    # The api pods' Service and the loops pod's headless one (deploy/README.md, "Two Deployments").
    assert matched == ["jaxcache", "jaxcache-loops"], (
        f"the ServiceMonitor's selector {wanted} must match the Services jaxcache and jaxcache-loops alone: {matched}")
    (endpoint,) = monitor["spec"]["endpoints"]
    for selected in matched:
        assert endpoint["port"] in {p["name"] for p in services[selected]["spec"]["ports"]}, (
            f"endpoint port {endpoint['port']!r} is no port name of the Service {selected}")
    assert endpoint["path"] == "/metrics" and "bearerTokenSecret" not in endpoint and "authorization" not in endpoint
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["namespace"] == namespace
    assert rule["spec"]["groups"] == rules_groups()
    without = {(d["kind"], d["metadata"]["name"]) for d in docs} - {("ServiceMonitor", "jaxcache"),
                                                                     ("PrometheusRule", "jaxcache")}
    assert without == {(d["kind"], d["metadata"]["name"]) for d in rendered[name]}, (
        "the component must only add the ServiceMonitor and the PrometheusRule")
