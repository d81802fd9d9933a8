"""The service as users run it: `jaxcache serve` in its own process, over real HTTP on a loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from conftest import jaxcache_serve

ADMIN = "e2e-admin-token"
H = {"Authorization": f"Bearer {ADMIN}"}



@pytest.fixture
def served(tmp_path, cache_copy):
    with jaxcache_serve({"demo": cache_copy}, f"sqlite:///{tmp_path / 'catalog.sqlite'}",
                        tokens={ADMIN: "admin"}) as base:
        yield base


@pytest.mark.slow
def test_serve_list_page_prune_over_http(served, cache_copy, jax_caches):
    with httpx.Client(base_url=served, headers=H, timeout=30) as c:
        assert c.get("/").status_code in (200, 307)
        keys, cursor = [], None
        while True:
            params = {"limit": 2, "sort": "size", "order": "desc", **({"cursor": cursor} if cursor else {})}
            body = c.get("/v1/caches/demo/entries", params=params).json()
            keys += [e["key"] for e in body["entries"]]
            cursor = body["next_cursor"]
            if not cursor:
                break
        assert sorted(keys) == sorted(e["key"] for e in jax_caches["zstd"].entries)
        assert len(keys) == len(set(keys))
        before = {p.name for p in cache_copy.iterdir()}
        policy = {"functions": ["jit_tiny"], "min_age": "0s"}
        plan = c.post("/v1/caches/demo/prune", json=policy).json()
        assert {p.name for p in cache_copy.iterdir()} == before
        applied = c.post("/v1/caches/demo/prune", json={**policy, "dry_run": False}).json()
        assert applied["deleted"] == len(plan["delete"]) == 1
        tiny = plan["delete"][0]["key"]
        assert {p.name for p in cache_copy.iterdir()} == before - {tiny + "-cache", tiny + "-atime"}
        assert c.get("/v1/caches/demo/prunes").json()["prunes"][0]["deleted"] == 1
        assert "jaxcache_prune_deleted_entries_total{cache=\"demo\"} 1.0" in c.get("/metrics").text


def test_serve_refuses_exposed_address_without_tokens(tmp_path, cache_copy):
    exe = Path(sys.executable).with_name("jaxcache")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}
    proc = subprocess.run(
        [str(exe), "serve", "--cache", f"demo={cache_copy}", "--host", "0.0.0.0",
         "--db", f"sqlite:///{tmp_path / 'c.sqlite'}"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 2
    assert "refusing to listen on 0.0.0.0 with no tokens" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--cache", "demo"], "expected NAME=URL"), (["--cache", "Bad Name=/tmp"], "cache name"),
     (["--cache", "x=/does/not/exist"], "does not exist"), ([], "no caches configured")],
)
def test_serve_bad_settings_exit_2(tmp_path, args, message):
    exe = Path(sys.executable).with_name("jaxcache")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}
    proc = subprocess.run([str(exe), "serve", *args, "--db", f"sqlite:///{tmp_path / 'c.sqlite'}"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
