"""Durations need their unit (#73 item 4): `jaxcache prune ROOT --unused-for 14 --min-age 0` once read 14 as seconds
and planned to delete every entry. A number without a unit, 0 aside, is refused in one line with the spelling to use
wherever a duration is taken: the CLI's duration flags, and prune policies (the API's body and query, a
policies.json, the dashboard's form, all read through the core). Settings whose names say their unit
(JAXCACHE_RESCAN_S, --rescan-s, JAXCACHE_RECORDS_RETAIN_D) keep their bare numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jaxcache.cli import main
from jaxcache.service.settings import ServiceSettings
from jaxcache.units import parse_duration
from prune_support import run_cli, snapshot
from reports_support import H_ADMIN

REPO = Path(__file__).parents[1]
NO_UNIT = "has no unit: write {n}d for days or {n}s for seconds"

# Every duration flag of the CLI, given a bare number.
FLAGS = [
    (["prune", "{root}", "--unused-for", "14", "--min-age", "0", "--apply"], "--unused-for", "14"),
    (["prune", "{root}", "--older-than", "30", "--apply"], "--older-than", "30"),
    (["prune", "{root}", "--corrupt", "--min-age", "3600"], "--min-age", "3600"),
    (["prune", "{root}", "--stale-jaxlib", "--stale-jaxlib-window", "7"], "--stale-jaxlib-window", "7"),
    (["doctor", "{root}", "--verify", "--min-age", "1.5"], "--min-age", "1.5"),
    (["explain", "{root}", "--since", "7"], "--since", "7"),
]


def test_a_duration_flag_without_a_unit_is_refused(capsys, cache_copy):
    before = snapshot(cache_copy)
    for argv, flag, number in FLAGS:
        code, out, err = run_cli(capsys, *(a.format(root=cache_copy) for a in argv))
        assert code == 2 and out == "", (argv, out)
        assert err.strip().splitlines() == [f"jaxcache: error: {flag}: '{number}' {NO_UNIT.format(n=number)} (m, h "
                                            "and w: minutes, hours and weeks)"], argv
    assert snapshot(cache_copy) == before, "nothing was deleted"
    # With a unit, and 0 alone (0 in every unit), as before.
    code, out, _ = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "14d", "--min-age", "0", "--older-than",
                           "2w", "--json")
    assert code == 0 and '"min_age": 0.0' in out and '"unused_for": 1209600.0' in out


def test_a_prune_policy_without_a_unit_is_refused(svc, cache_copy):
    before = snapshot(cache_copy)
    # policies.json's `"unused_for": 14` reads as days as well as seconds.
    for body, field, number in (({"unused_for": 14, "dry_run": False}, "unused_for", "14"),
                                ({"older_than": "30", "dry_run": False}, "older_than", "30"),
                                ({"corrupt": True, "min_age": 3600.0, "dry_run": False}, "min_age", "3600")):
        r = svc.post("/v1/caches/demo/prune", json=body, headers=H_ADMIN)
        assert r.status_code == 422, r.text
        [problem] = r.json()["detail"]
        assert problem["loc"] == ["body", field] and NO_UNIT.format(n=number) in problem["msg"], problem
    r = svc.get("/v1/caches/demo/entries?unused_for=14", headers=H_ADMIN)
    assert r.status_code == 422 and NO_UNIT.format(n=14) in r.text
    assert snapshot(cache_copy) == before
    plan = svc.post("/v1/caches/demo/prune", json={"unused_for": "14d", "min_age": 0}, headers=H_ADMIN)
    assert plan.status_code == 200, plan.text


def test_settings_named_for_their_unit_keep_bare_numbers(monkeypatch):
    monkeypatch.setenv("JAXCACHE_RESCAN_S", "60")
    monkeypatch.setenv("JAXCACHE_RECORDS_RETAIN_D", "14")
    settings = ServiceSettings()
    assert settings.rescan_s == 60 and settings.records_retain_s == 14 * 86400


def test_the_docs_and_help_write_durations_with_their_unit(capsys):
    """Every duration the README and the guides show for a flag or a policy field parses; --help says a unit is
    needed."""
    shown = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "deploy" / "README.md",
                 REPO / "deploy" / "k8s" / "base" / "prune" / "policies.json"]:
        text = page.read_text()
        shown += re.findall(r"--(?:unused-for|older-than|min-age|stale-jaxlib-window|since)[ =]([^\s\]`'\"|)]+)", text)
        shown += re.findall(r'"(?:unused_for|older_than|min_age|stale_jaxlib_window)": *("[^"]*"|[0-9.]+)', text)
    assert len(shown) > 10
    for value in shown:
        if value != "DURATION" and not value.startswith("-"):  # `--unused-for -3d` is shown refused
            parse_duration(value.strip('"'))  # raises for a bare number
    with pytest.raises(SystemExit):
        main(["prune", "--help"])
    assert "Durations take a unit" in capsys.readouterr().out
