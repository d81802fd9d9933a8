"""A background pass that does not return (issue #32: a thread blocked for good in a rescan): `/readyz`, the metrics
and the dashboard say which loop and cache are stuck without making the replica unready, and SIGTERM still stops a
real `jaxcache serve` after a bounded wait.

The pass is blocked as another replica blocks it: by holding the SQLite catalog's write lock (an open ``BEGIN
IMMEDIATE``), which every rescan's commit waits for (up to the catalog's 60 s busy timeout). The issue's FIFO cannot
be placed deterministically: listings skip what is not a regular file, so only one swapped in between a listing
and its read blocks. Settings make the bound short (``JAXCACHE_STUCK_AFTER_S``); nothing here asserts how long
anything took, only bounds how long a test waits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from conftest import serve_env, settled, start_serve, wait_ready
from jaxcache.service.app import create_app
from jaxcache.service.background import LoopStatus, stuck_after
from test_service import H_READ, make_settings

#: Bound on waiting for background work or another process; never asserted on.
PATIENCE_S = 60.0
#: Bound on waiting for a SIGTERMed service to exit: well under the 60 s the blocked pass would take to fail, and
#: well over JAXCACHE_SHUTDOWN_WAIT_S below.
EXIT_PATIENCE_S = 30.0


def _wait(predicate: Callable[[], Any], what: str, patience_s: float = PATIENCE_S) -> Any:
    deadline = time.monotonic() + patience_s
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)
    return found


@contextlib.contextmanager
def write_lock_held(db: Path) -> Iterator[None]:
    """Another replica's write transaction on the SQLite catalog, open until the block ends."""
    holder = sqlite3.connect(db, isolation_level=None, timeout=PATIENCE_S)
    try:
        holder.execute("BEGIN IMMEDIATE")
        yield
    finally:
        with contextlib.suppress(sqlite3.Error):
            holder.execute("ROLLBACK")
        holder.close()


def _stuck_rescan(get: Callable[[str], Any]) -> Any:
    """/readyz's answer once it shows the rescan loop stuck on demo, else None (the pass may read stuck a moment
    before the cache it reached after its start does)."""
    ready = get("/readyz")
    rescan = ready.json()["loops"].get("rescan", {})
    return ready if rescan.get("state") == "stuck" and rescan.get("caches", {}).get("demo") == "stuck" else None


def test_a_stuck_pass_is_shown_and_never_makes_the_replica_unready(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    app = create_app(make_settings(tmp_path, {"demo": str(root)}, rescan_s=0.2, stuck_after_s=1,
                                   shutdown_wait_s=1, snapshot_dir=""))
    with TestClient(app) as client:
        settled(client)
        before = client.get("/readyz").json()["loops"]["rescan"]
        assert before["state"] == "ok" and before["caches"] == {"demo": "ok"} and before["stuck_after_s"] == 1
        with write_lock_held(tmp_path / "catalog.sqlite"):
            ready = _wait(lambda: _stuck_rescan(client.get), "the blocked rescan to read stuck")
            assert ready.status_code == 200 and ready.json()["status"] == "ok", ready.text  # serves what it has
            rescan = ready.json()["loops"]["rescan"]
            assert rescan["caches"] == {"demo": "stuck"} and rescan["running_cache"] == "demo"
            assert rescan["running_since_s"] is not None and rescan["failures"] == 0
            assert 'jaxcache_loop_stuck{loop="rescan"} 1.0' in client.get("/metrics").text
            for page in ("/", "/caches/demo"):  # the caches with their last scans, and the cache's overview
                text = client.get(page, headers=H_READ).text
                assert 'data-loop="rescan" data-state="stuck">(rescan stuck' in text, page
            assert '<tr data-loop="rescan" data-state="stuck">' in client.get("/", headers=H_READ).text
        # Let go: the pass commits, and the loop reads ok again.
        _wait(lambda: client.get("/readyz").json()["loops"]["rescan"]["state"] == "ok", "the rescan to finish")
        assert 'jaxcache_loop_stuck{loop="rescan"} 0.0' in client.get("/metrics").text
        assert 'data-state="stuck"' not in client.get("/", headers=H_READ).text


def _as_pid_1(tmp_path: Path) -> Path:
    """A `jaxcache` that runs serve as PID 1 of a PID namespace of its own, as a container's ENTRYPOINT does
    (deploy/docker/service.Dockerfile). There a signal without a handler is ignored: uvicorn's raising SIGTERM
    again after its shutdown does not end the process, which exits only when its interpreter may."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--pid", "--fork", "true"], capture_output=True).returncode:
        pytest.skip("cannot make a PID namespace here (unshare --pid needs root or user namespaces): the "
                    "container's PID 1 goes untested")
    wrapper = tmp_path / "jaxcache-as-pid-1"
    wrapper.write_text(f'#!/bin/sh\nexec {unshare} --pid --fork --kill-child '
                       f'{Path(sys.executable).with_name("jaxcache")} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.parametrize(("how", "workers"), [("SIGTERM", "1"), ("SIGINT", "1"), ("SIGTERM to PID 1", "1"),
                                              ("SIGTERM", "2")])
def test_sigterm_stops_a_serve_whose_background_pass_is_blocked(tmp_path, how, workers):
    """The issue's "SIGTERM does not stop the service": the blocked pass's thread is left behind after
    JAXCACHE_SHUTDOWN_WAIT_S, with one line naming it, and neither the app's shutdown nor the interpreter's exit
    waits for it (Ctrl-C, and SIGTERM to a container's PID 1, end in the interpreter's exit; before, it joined
    the thread pool's thread, blocked). With workers, every worker's /readyz shows the leader's stuck loop."""
    root = tmp_path / "cache"
    root.mkdir()
    db = tmp_path / "catalog.sqlite"
    log = tmp_path / "serve.log"
    env = serve_env(JAXCACHE_RESCAN_S="0.2", JAXCACHE_STUCK_AFTER_S="1", JAXCACHE_SHUTDOWN_WAIT_S="2",
                    JAXCACHE_SNAPSHOT_DIR="")
    exe = _as_pid_1(tmp_path) if how.endswith("PID 1") else None
    with log.open("w") as out:
        proc, base = start_serve({"demo": root}, f"sqlite:///{db}", env=env, args=("--workers", workers),
                                 stdout=out, exe=exe)
    try:
        wait_ready(proc, base, output=log.read_text)
        # unshare's child is the service (PID 1 inside): the one to signal.
        target = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0]) if exe else proc.pid
        with write_lock_held(db):
            def get(path: str) -> httpx.Response:
                return httpx.get(f"{base}{path}", timeout=60)  # a bound on a loaded machine, not a timing

            for _ in range(2 * int(workers)):  # with workers, the answers come from either
                ready = _wait(lambda: _stuck_rescan(get), "the blocked rescan to read stuck")
                assert ready.status_code == 200, ready.text
                assert ready.json()["loops"]["rescan"]["caches"] == {"demo": "stuck"}
            assert 'jaxcache_loop_stuck{loop="rescan"} 1.0' in get("/metrics").text
            os.kill(target, signal.SIGINT if how == "SIGINT" else signal.SIGTERM)
            try:
                proc.wait(timeout=EXIT_PATIENCE_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"SIGTERM did not stop jaxcache serve while a pass was blocked:\n{log.read_text()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = log.read_text()
    assert "stopping without waiting longer for the rescan pass on cache 'demo'" in said, said
    # uvicorn ends by raising the signal it caught again, once the app has shut down (Ctrl-C: exit status 130):
    # not our kill().
    assert proc.returncode in (0, 130, -signal.SIGTERM), said


def test_the_bound_is_three_periods_at_least_ten_minutes_and_steps_count_as_moving():
    """How a status reads, at given clocks: a pass is stuck past its bound, one that reports steps (a throttled
    verification, batch by batch) past its bound since the last step; the workers' JSON gives the same."""
    assert stuck_after(300, None) == 900 and stuck_after(1, None) == 600 and stuck_after(300, 5) == 5
    running = LoopStatus(running_since_s=1000.0, running_cache="demo", cache_since_s=1000.0, stuck_after_s=900.0)
    assert running.health(1800) == "ok" and running.health(2000) == "stuck"
    assert running.cache_health(["demo", "ci"], 2000) == {"demo": "stuck", "ci": "ok"}
    stepping = replace(running, progress_s=1500.0)
    assert stepping.health(2000) == "ok" and stepping.cache_health(["demo"], 2000) == {"demo": "ok"}
    assert stepping.health(2500) == "stuck"
    failing = LoopStatus(failures=2, last_error="ci: root gone", failed_caches=("ci",))
    assert failing.health(0) == "failing"
    assert failing.cache_health(["demo", "ci"], 0) == {"demo": "ok", "ci": "failing"}
    for status in (running, stepping, failing):
        assert LoopStatus.from_dict(json.loads(json.dumps(asdict(status)))) == status
