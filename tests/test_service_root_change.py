"""A cache served from another root than before, for real through `jaxcache serve`: one line at start names the
cache, both roots and what happens to its job history; JAXCACHE_ROOT_CHANGED keeps it (the default) or drops it."""

from __future__ import annotations

import time

import httpx
import pytest

from conftest import serve_env, start_serve, stop_serve, wait_ready
from reports_support import hit, run

PATIENCE_S = 120
TOKENS = {"rc-report": "report", "rc-read": "read"}
READ = {"Authorization": "Bearer rc-read"}
KEY = "jit_step-" + "ab" * 32


def _jobs(base: str) -> list[str]:
    answer = httpx.get(f"{base}/v1/caches/demo/jobs", headers=READ, timeout=30)
    assert answer.status_code == 200, answer.text
    return [j["job"] for j in answer.json()["jobs"]]


def _serve(root, db: str, **env: str):
    """Start `jaxcache serve` over root as cache "demo"; returns the process and its base URL, once ready."""
    proc, base = start_serve({"demo": root}, db, env=serve_env(TOKENS, **env))
    wait_ready(proc, base, patience_s=PATIENCE_S)
    return proc, base


def _stop(proc) -> str:
    stop_serve(proc)
    return proc.stdout.read()


def _said(output: str) -> str:
    """The one line about a changed root (not two: the log record is not printed again)."""
    lines = [ln for ln in output.splitlines() if "root changed" in ln]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.slow
def test_a_changed_root_is_said_at_start_and_its_history_kept_or_dropped(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    db = f"sqlite:///{tmp_path / 'catalog.sqlite'}"
    proc, base = _serve(a, db)
    try:
        answer = httpx.post(f"{base}/v1/reports?cache=demo", content=run("train", "r1", [hit(KEY, 3, time.time())])
                            .to_json(), headers={"content-type": "application/json",
                                                 "Authorization": "Bearer rc-report"}, timeout=PATIENCE_S)
        assert answer.status_code == 202, answer.text
        deadline = time.monotonic() + PATIENCE_S  # the drain folds it: a bound, not a timing assertion
        while _jobs(base) != ["train"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _jobs(base) == ["train"]
    finally:
        said = _stop(proc)
    assert "root changed" not in said

    proc, base = _serve(b, db)  # JAXCACHE_ROOT_CHANGED unset: keep
    try:
        assert _jobs(base) == ["train"]
    finally:
        said = _stop(proc)
    line = _said(said)
    assert f"cache 'demo': root changed from {a} to {b}" in line and "(1 run) is kept" in line
    assert "JAXCACHE_ROOT_CHANGED=drop" in line

    proc, base = _serve(a, db, JAXCACHE_ROOT_CHANGED="drop")
    try:
        assert _jobs(base) == []
    finally:
        said = _stop(proc)
    line = _said(said)
    assert f"cache 'demo': root changed from {b} to {a}" in line and "(1 run) was dropped" in line

    proc, base = _serve(a, db, JAXCACHE_ROOT_CHANGED="drop")  # the same root again: nothing to say or drop
    try:
        assert _jobs(base) == []
    finally:
        said = _stop(proc)
    assert "root changed" not in said


def test_root_changed_takes_keep_or_drop_only(tmp_path):
    proc, _ = start_serve({"demo": tmp_path}, f"sqlite:///{tmp_path / 'c.sqlite'}",
                          env=serve_env(TOKENS, JAXCACHE_ROOT_CHANGED="forget"))
    assert proc.wait(timeout=PATIENCE_S) != 0
    said = proc.stdout.read()
    assert "root_changed" in said.lower() and "keep" in said and "drop" in said, said
