"""`jaxcache serve --role`, for real: `api` processes accept reports and answer requests and run no background loop;
one `loops` process on the same catalog scans the caches and folds what every process accepted, and no process
lists a root again that another has scanned. Nothing waits for a time to pass but for another process to get
somewhere (bounded, never asserted on)."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi.testclient import TestClient

from conftest import jaxcache_serve, serve_env, settled, start_serve, stop_serve, wait_ready
from jaxcache.service.app import create_app
from reports_support import hit, keys_of, run
from test_service import H_ADMIN, make_settings

PATIENCE_S = 120
TOKENS = {"r-report": "report", "r-read": "read"}
READ = {"Authorization": "Bearer r-read"}


def _until(condition, what: str):
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def _hits(base: str, key: str) -> int:
    body = httpx.get(f"{base}/v1/caches/demo/entries?limit=1000", headers=READ, timeout=30).json()
    return next(e["hits"] for e in body["entries"] if e["key"] == key)


def _waiting(base: str) -> int:
    caches = httpx.get(f"{base}/v1/caches", headers=READ, timeout=30).json()["caches"]
    return next(c["reports_waiting"] for c in caches if c["name"] == "demo")


@pytest.mark.slow
def test_api_processes_accept_reports_that_the_loops_process_folds(catalog_url, cache_copy, jax_caches):
    """On PostgreSQL the loops process's drain is woken by the api process's NOTIFY (it does not poll); on SQLite
    it polls the inbox for what other processes stored."""
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    db = catalog_url
    caches = {"demo": cache_copy}
    at = time.time()

    def post(base: str, run_id: str) -> None:
        answer = httpx.post(f"{base}/v1/reports?cache=demo", content=run("j", run_id, [hit(train, 1, at)],
                                                                           at=at).to_json(),
                            headers={"content-type": "application/json", "Authorization": "Bearer r-report"},
                            timeout=PATIENCE_S)
        assert answer.status_code == 202, answer.text

    # The loops process first: an api process is ready once every cache was scanned, by whichever process.
    loops_proc, loops = start_serve(caches, db, env=serve_env(TOKENS),
                                    args=("--role", "loops"))
    try:
        wait_ready(loops_proc, loops, patience_s=PATIENCE_S)
        with jaxcache_serve(caches, db, tokens=TOKENS, args=("--role", "api")) as api:
            before = _hits(api, train)
            post(api, "r1")
            _until(lambda: _hits(api, train) == before + 1, "the record the api process accepted, folded")
            drained = httpx.get(f"{loops}/readyz", timeout=30).json()["loops"]["drain"]
            assert drained["last_success_s"]
            # It ran none, and shows the loops process's published status, as its /metrics does.
            assert httpx.get(f"{api}/readyz", timeout=30).json()["loops"]["drain"]["state"] == "ok"
            scraped = httpx.get(f"{api}/metrics", timeout=30).text
            assert 'jaxcache_loop_stuck{loop="drain"} 0.0' in scraped
            assert 'jaxcache_loop_failing{loop="drain"} 0.0' in scraped
            assert 'jaxcache_loop_last_success_timestamp_seconds{loop="drain"}' in scraped
            # With the loops process gone, what the api process accepts waits in the inbox for the next one.
            stop_serve(loops_proc)
            post(api, "r2")
            assert _waiting(api) == 1 and _hits(api, train) == before + 1
            with jaxcache_serve(caches, db, tokens=TOKENS, args=("--role", "loops")):
                _until(lambda: _waiting(api) == 0 and _hits(api, train) == before + 2, "the waiting record folded")
    finally:
        stop_serve(loops_proc)


def test_role_is_checked_and_explained_by_serve():
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("jaxcache")
    done = subprocess.run([str(exe), "serve", "--role", "writer"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--role" in done.stderr and "'api'" in done.stderr
    helped = subprocess.run([str(exe), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert "--role {all,api,loops}" in helped.stdout


def test_a_process_does_not_rescan_a_cache_another_process_scanned(tmp_path, cache_copy):
    """A verification (asked for, or the verify loop's) in a process that has not scanned the cache itself follows
    the scan another process recorded in the catalog rather than listing the root again: with workers, one
    rescanning as its first verify pass took the cache's rescan lock from the rescan loop."""
    caches = {"demo": str(cache_copy)}
    # Both start before the first scan, as the workers of one `serve --workers` do.
    with TestClient(create_app(make_settings(tmp_path, caches, role="api"))) as api:
        with TestClient(create_app(make_settings(tmp_path, caches))) as loops:
            settled(loops)
            assert api.post("/v1/caches/demo/verify", headers=H_ADMIN).status_code == 200
            assert 'jaxcache_scan_seconds_count{cache="demo"} 0.0' in api.get("/metrics").text
            assert 'jaxcache_scan_seconds_count{cache="demo"} 1.0' in loops.get("/metrics").text
