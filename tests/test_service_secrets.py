"""What the service exposes: the catalog's password never printed or logged, a catalog that does not answer is one
clear line, and a read token cannot make the service read every entry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from conftest import serve_env, start_serve, stop_serve, wait_ready
from jaxcache.service.app import create_app
from jaxcache.service.caches import summary
from ports import free_port
from test_service import H_ADMIN, H_READ, make_settings

PASSWORD = "pw-4f9c2d1e-do-not-print"



def test_serve_never_prints_the_catalog_password(tmp_path, pg_url, cache_copy):
    # The throwaway server trusts loopback connections: any password is accepted, and none may be shown.
    url = pg_url.replace("postgres@", f"postgres:{PASSWORD}@")
    proc, base = start_serve({"demo": cache_copy}, None, env=serve_env(JAXCACHE_DB=url))
    try:
        wait_ready(proc, base)
        httpx.get(f"{base}/readyz", timeout=30)
        httpx.get(f"{base}/v1/caches/demo/entries", timeout=30)  # refused (no token): logged, not with the URL
    finally:
        stop_serve(proc)
    out = proc.stdout.read() if proc.stdout else ""
    first = out.splitlines()[0]
    assert first.startswith("jaxcache service: http://localhost:") and "postgres:***@127.0.0.1" in first, out
    assert PASSWORD not in out


def test_an_unreachable_catalog_is_one_line_and_exit_2(tmp_path, cache_copy):
    port = free_port()  # nothing listens there
    exe = Path(sys.executable).with_name("jaxcache")
    for db in (f"postgresql+psycopg://jc:{PASSWORD}@127.0.0.1:{port}/catalog", "not a url"):
        proc = subprocess.run([str(exe), "serve", "--cache", f"demo={cache_copy}"], capture_output=True, text=True,
                              timeout=60, env=serve_env(JAXCACHE_DB=db))
        said = proc.stderr.strip()
        assert proc.returncode == 2, said
        assert len(said.splitlines()) == 1 and "Traceback" not in said and PASSWORD not in said, said


def test_an_unreachable_catalog_names_host_port_and_what_to_check(cache_copy):
    port = free_port()
    exe = Path(sys.executable).with_name("jaxcache")
    db = f"postgresql+psycopg://jc:{PASSWORD}@127.0.0.1:{port}/catalog"
    proc = subprocess.run([str(exe), "serve", "--cache", f"demo={cache_copy}"], capture_output=True, text=True,
                          timeout=60, env=serve_env(JAXCACHE_DB=db))
    assert proc.returncode == 2
    assert f"cannot reach the catalog database at 127.0.0.1:{port}" in proc.stderr
    assert "database 'catalog' as 'jc'" in proc.stderr and "JAXCACHE_DB" in proc.stderr
    assert PASSWORD not in proc.stderr


def test_a_dry_run_prune_with_integrity_reads_nothing(tmp_path, cache_copy):
    """Anyone with a read token may preview a prune: it uses the verdicts made so far, never hashes entries."""
    from sqlalchemy import func, select

    from jaxcache.service.catalog.models import VerificationRow

    app = create_app(make_settings(tmp_path, {"demo": str(cache_copy)}))
    client = TestClient(app)  # no lifespan: no background pass judges entries behind the test's back
    state = app.state.jaxcache
    assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
    entries = summary.caches(state)[0].entries

    def judged() -> int:
        with state.catalog.session() as s:
            return s.scalar(select(func.count()).select_from(VerificationRow)) or 0

    body = {"integrity": ["corrupt", "tampered"], "dry_run": True}
    r = client.post("/v1/caches/demo/prune", headers=H_READ, json=body)
    assert r.status_code == 200, r.text
    assert judged() == 0
    assert any(f"{entries} entries are not judged yet" in n for n in r.json()["notes"]), r.json()["notes"]
    page = client.get("/caches/demo/prune?integrity=corrupt&integrity=tampered&preview=1", headers=H_READ)
    assert page.status_code == 200 and "entries are not judged yet" in page.text and judged() == 0
    assert client.post("/v1/caches/demo/prune", headers=H_READ, json={**body, "dry_run": False}).status_code == 403
    assert judged() == 0
    r = client.post("/v1/caches/demo/prune", headers=H_ADMIN, json={**body, "dry_run": False})
    assert r.status_code == 200, r.text
    assert judged() == entries, "applying judges every entry first"
