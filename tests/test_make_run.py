"""What `make run` says before it serves, in its own terms: the port it is about to take is checked first, and a
busy one is told with `make run PORT=...` (serve's --port is not what a make user can pass); the demo's admin token
is offered only when the service is not already serving with it (#73)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = [sys.executable, "-m", "jaxcache.service.demo"]


def _demo(*args: str, tokens_file: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "JAXCACHE_TOKENS_FILE"}
    if tokens_file is not None:
        env["JAXCACHE_TOKENS_FILE"] = tokens_file
    return subprocess.run([*DEMO, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_run_checks_its_host_and_port_before_it_serves():
    shown = subprocess.run(["make", "-n", "run", "PORT=9123", "HOST=127.0.0.2"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    lines = shown.splitlines()
    check = next(i for i, line in enumerate(lines) if "-m jaxcache.service.demo " in line)
    assert lines[check].endswith("--host 127.0.0.2 --port 9123"), lines[check]
    assert any("jaxcache serve" in line for line in lines[check + 1:]), shown


def test_a_busy_port_is_told_with_make_runs_variable(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        proc = _demo(str(tmp_path / "demo-catalog"), "--host", "127.0.0.1", "--port", str(port))
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "make run PORT=9000, or PORT=0" in proc.stderr
    assert "--port" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    free = _demo(str(tmp_path / "demo-catalog"), "--host", "127.0.0.1", "--port", str(port))
    assert free.returncode == 0, free.stderr


def test_the_admin_token_hint_is_not_given_when_it_is_already_served_with(tmp_path):
    demo = tmp_path / "demo-catalog"
    offered = _demo(str(demo))
    assert f"JAXCACHE_TOKENS_FILE={demo / 'tokens'} make run" in offered.stderr, offered.stderr
    served = _demo(str(demo), tokens_file=str(demo / "tokens"))
    assert served.returncode == 0 and "make run" not in served.stderr, served.stderr
    assert "serving with the admin token made for this demo" in served.stderr
    assert f"sign in (/login) with the token in {demo / 'admin-token'}" in served.stderr
    assert _demo(str(demo), tokens_file=str(tmp_path / "mine")).stderr == "", "the user's own tokens: nothing to add"
