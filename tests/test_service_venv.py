"""The service installs and runs without JAX: a fresh venv with only the core and the service (what the service's
image installs) has no jax or jaxlib, and `jaxcache serve`, `ls`, `stats`, `doctor` and `prune` work there."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from conftest import serve_env, start_serve, stop_serve, wait_ready

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def service_venv(tmp_path_factory) -> Path:
    """A venv with `pip install ./core ./service`, from copies of the folders (a build leaves files behind)."""
    base = tmp_path_factory.mktemp("service-venv")
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    for part in ("core", "service"):
        shutil.copytree(ROOT / part, base / part, ignore=ignore)
    venv = base / "venv"
    # Without a pip of its own, installed into by this venv's (`pip --python`): bootstrapping one took 9 of the
    # fixture's 50 s, and this pip resolves faster than the one a Python 3.11 venv brings.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    proc = subprocess.run([*_pip(venv), "install", "--quiet", str(base / "core"), str(base / "service")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv


def _pip(venv: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]


def _jaxcache(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "jaxcache"), *args], capture_output=True, text=True, timeout=300,
                          env=serve_env())


def test_the_service_venv_has_no_jax(service_venv):
    listed = subprocess.run([*_pip(service_venv), "list", "--format", "json"],
                            capture_output=True, text=True, check=True, timeout=120).stdout
    names = {d["name"].lower() for d in json.loads(listed)}
    assert {"jaxcache", "jaxcache-service"} <= names
    assert not names & {"jax", "jaxlib", "jaxcache-client", "jaxcache-warmup"}, sorted(names)


def test_the_cli_works_without_jax(service_venv, cache_copy):
    for args in (["ls", str(cache_copy)], ["stats", str(cache_copy), "--json"], ["prune", str(cache_copy),
                                                                                  "--corrupt"]):
        proc = _jaxcache(service_venv, *args)
        assert proc.returncode == 0, (args, proc.stderr)
    doctor = _jaxcache(service_venv, "doctor", str(cache_copy), "--json")
    assert doctor.returncode in (0, 1) and json.loads(doctor.stdout)["checked"] > 0, doctor.stderr
    assert json.loads(_jaxcache(service_venv, "stats", str(cache_copy), "--json").stdout)["entries"] > 0
    # A part that is not installed says what to install, in one line.
    warm = _jaxcache(service_venv, "warmup", "--help")
    assert warm.returncode == 2 and "pip install jaxcache-warmup" in warm.stderr and "Traceback" not in warm.stderr


def test_jaxcache_serve_works_without_jax(service_venv, cache_copy, tmp_path):
    proc, base = start_serve({"demo": cache_copy}, f"sqlite:///{tmp_path / 'catalog.sqlite'}", env=serve_env(),
                             exe=service_venv / "bin" / "jaxcache")
    try:
        wait_ready(proc, base)
        entries = httpx.get(f"{base}/v1/caches/demo/entries", timeout=10).json()["entries"]
        assert entries and all(e["key"] for e in entries)
        assert httpx.get(f"{base}/", timeout=10, follow_redirects=True).status_code == 200
    finally:
        stop_serve(proc)
