"""deploy/'s alerting rules: promtool's syntax check and unit tests, the PrometheusRule the same as the plain
rules file, and every alert actionable."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy_support import DEPLOY, K8S, load_docs, one

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
