"""The demo a newcomer meets first (#52): `make demo-cache`, as the Makefile runs it, leaves a cache whose job missed
once for a real cause, and `jaxcache explain`, the job's page and the cache page's "Top miss causes" all explain it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from dashboard_support import ROOT
from jaxcache.service.app import create_app
from jaxcache.service.settings import ServiceSettings


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_", "XLA_"))}


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine: the demo is a Makefile target")
def test_the_demo_cache_shows_a_miss_explained(tmp_path):
    demo = tmp_path / "demo-cache"
    venv = tmp_path / "venv"  # the recipe's own interpreter is this one: -o keeps make from building a venv
    proc = subprocess.run(["make", "-s", "-o", f"{venv}/.stamp-run", "demo-cache", f"VENV={venv}",
                           f"PY={sys.executable}", f"DEMO_CACHE={demo}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 miss" in proc.stdout, proc.stdout  # the job's second run said so itself

    explained = subprocess.run([sys.executable, "-m", "jaxcache", "explain", str(demo)], capture_output=True,
                               text=True, timeout=120, env=clean_env())
    assert explained.returncode == 0, explained.stderr
    assert "no misses recorded" not in explained.stdout
    assert "program_changed" in explained.stdout and "jit_step" in explained.stdout, explained.stdout
    assert "f32[16,64]" in explained.stdout and "f32[32,64]" in explained.stdout  # the batch size that changed

    settings = ServiceSettings(caches={"demo": str(demo)}, db=f"sqlite:///{tmp_path / 'catalog.sqlite'}",
                               insecure_no_auth=True)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/caches/demo/rescan").status_code == 200
        job = client.get("/caches/demo/jobs/demo-job")
        assert job.status_code == 200
        assert "No misses" not in job.text and 'data-cause="program_changed"' in job.text, job.text[:2000]
        assert "jit_step is not the program the cache has" in job.text
        overview = client.get("/caches/demo").text
        assert '<tr data-cause="program_changed">' in overview
        assert "No explained misses" not in overview
