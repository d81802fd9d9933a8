"""A store that stops answering, refuses connections or throttles costs seconds, not minutes (#71): the CLI says in one
line that it cannot reach the root; `jaxcache serve` listens at once, and its readiness, API and dashboard say which
root cannot be reached and that the rescan loop fails, until the store answers again. A throttling store is
slowed, never cut off. Real emulators, stopped with SIGSTOP (connections accepted, nothing answered) and resumed;
the CLI and the service in subprocesses, each waited for with a watchdog far below the minutes this used to cost."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import serve_env, start_serve, stop_serve
from ports import free_port
from store_faults import S3Faults
from store_servers import STARTERS, NotInstalled, Server, azurite_connection_string, raw_put

JAXCACHE = Path(sys.executable).with_name("jaxcache")
#: How long the CLI and the service wait for a store's first answer here (JAXCACHE_REACH_S).
REACH_S = "2"
#: The watchdog on one CLI run: the old minutes would trip it; startup and the deadline take a few seconds.
CLI_WATCHDOG_S = 45
PATIENCE_S = 45.0


def _until(condition, what: str):
    deadline = time.monotonic() + PATIENCE_S
    while not (found := condition()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)
    return found


@contextlib.contextmanager
def _own_server(scheme: str, folder: Path) -> Iterator[Server]:
    """An emulator of this test's own (the session's must never be stopped), the environment pointed at it."""
    try:
        server = STARTERS[scheme](folder)
    except NotInstalled as exc:
        pytest.skip(str(exc))
    try:
        with server.pointed_at():
            yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


@contextlib.contextmanager
def _stopped(server: Server) -> Iterator[None]:
    """The emulator stopped (its port still accepts connections; nothing is answered), resumed afterwards."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def _new_bucket(scheme: str) -> str:
    name = f"reach-{os.urandom(5).hex()}"
    if scheme == "gs":
        from google.cloud import storage

        storage.Client().create_bucket(name)
    elif scheme == "s3":
        import boto3

        boto3.client("s3").create_bucket(Bucket=name)
    else:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]).create_container(name)
    return name


def _put_entries(root: str, n: int) -> None:
    """``n`` objects named as JAX names entries (their bytes are not programs: a listing does not care)."""
    for i in range(n):
        raw_put(root, f"jit_reach{i:03d}-{hashlib.sha256(str(i).encode()).hexdigest()}-cache", b"x" * 64)


def _refusing(scheme: str) -> dict[str, str]:
    """The environment pointing the store's library at a loopback port nothing listens on."""
    url = f"http://127.0.0.1:{free_port()}"
    return {"gs": {"STORAGE_EMULATOR_HOST": url}, "s3": {"AWS_ENDPOINT_URL": url},
            "az": {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(url)}}[scheme]


def _cli(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JAXCACHE), *argv], capture_output=True, text=True, timeout=CLI_WATCHDOG_S,
                          env=serve_env(JAXCACHE_REACH_S=REACH_S, **env))


@pytest.mark.parametrize("scheme", ["gs", "s3", "az"])
def test_the_cli_says_in_one_line_that_a_store_does_not_answer(tmp_path, scheme):
    with _own_server(scheme, tmp_path) as server:
        root = f"{scheme}://{_new_bucket(scheme)}/jax-cache"
        _put_entries(root, 2)
        endpoint = server.url.removeprefix("http://")
        with _stopped(server):
            for argv in (("ls", root), ("stats", root, "--json")):
                done = _cli(*argv)
                said = done.stderr.strip().splitlines()
                assert done.returncode == 2 and not done.stdout and len(said) == 1, done
                assert said[0].startswith("jaxcache: error: ") and root in said[0] and endpoint in said[0], said
                assert "did not answer within 2 s" in said[0] and "JAXCACHE_REACH_S" in said[0], said
        # An endpoint that refuses connections: the library retries, the deadline answers.
        done = _cli("ls", root, **_refusing(scheme))
        said = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(said) == 1 and root in said[0], done
        # Answering again: the same command works.
        done = _cli("ls", root, "--json")
        assert done.returncode == 0 and len(json.loads(done.stdout)["entries"]) == 2, done


def _get(base: str, path: str) -> httpx.Response:
    return httpx.get(f"{base}{path}", timeout=10)


def _cache(base: str) -> dict:
    return _get(base, "/v1/caches").json()["caches"][0]


def test_a_store_that_stops_answering_is_shown_by_a_service_that_listens_at_once(tmp_path):
    """Two workers, as by default on a multi-core host: each worker's rescan pass must keep the loop shown failing."""
    with _own_server("s3", tmp_path) as server:
        root = f"s3://{_new_bucket('s3')}/jax-cache"
        _put_entries(root, 3)
        endpoint = server.url.removeprefix("http://")
        log = tmp_path / "serve.log"
        with _stopped(server), open(log, "w") as out:
            proc, base = start_serve({"demo": root}, f"sqlite:///{tmp_path / 'c.sqlite'}",
                                     env=serve_env(JAXCACHE_REACH_S=REACH_S), stdout=out,
                                     args=("--rescan-s", "1", "--workers", "2"))
            try:
                # Listening, and answering, while the store answers nothing.
                ready = _until(lambda: _answer(base, "/readyz"), "/readyz to answer while the store is stopped")
                assert ready.status_code == 503 and "first scan not finished" in ready.json()["detail"]["demo"]
                assert ready.json()["status"] == "not ready"
                ready = _until(lambda: (r := _get(base, "/readyz")).json()["roots"]["demo"]["reachable"] is False
                               and r, "readyz to say the root cannot be reached")
                said = ready.json()
                assert ready.status_code == 503 and "cannot be reached" in said["detail"]["demo"]
                assert root in said["roots"]["demo"]["error"] and endpoint in said["roots"]["demo"]["error"]
                # Each worker shows its own last look, and asking starts one where there is none yet: the
                # other worker's first answer may be the failed scan's alone.
                cache = _until(lambda: (c := _cache(base))["scan_state"] == "unreachable" and c, "the API to say so")
                assert cache["reachable"] is False, cache
                assert cache["unreachable_since_s"] and endpoint in cache["root_error"] and cache["last_scan_s"] is None
                _until(lambda: _get(base, "/v1/caches/demo/stats").json()["scan_state"] == "unreachable", "stats")
                page = _until(lambda: 'data-root="unreachable"' in (t := _get(base, "/").text) and t, "the page")
                assert "not scanned yet" in page and endpoint in page
                page = _until(lambda: 'data-root="unreachable"' in (t := _get(base, "/caches/demo").text) and t,
                              "the cache's page")
                assert "Not scanned yet: its root cannot be reached" in page
                # The rescan loop fails (its passes are bounded by the deadline), and stays shown failing while
                # either worker's next pass runs.
                _until(lambda: _get(base, "/readyz").json()["loops"].get("rescan", {}).get("state") == "failing",
                       "the rescan loop to show failing")
                for _ in range(20):
                    loop = _get(base, "/readyz").json()["loops"]["rescan"]
                    assert loop["state"] == "failing" and loop["caches"]["demo"] == "failing", loop
                    time.sleep(0.15)
                assert 'data-loop="rescan" data-state="failing"' in _get(base, "/caches/demo").text
            except BaseException:
                stop_serve(proc)
                raise
        try:
            # Answering again: the next rescan succeeds, and every sign of the outage clears.
            _until(lambda: _get(base, "/readyz").status_code == 200, "the service to be ready once the store answers")
            _until(lambda: _cache(base)["entries"] == 3, "the entries to be cataloged")
            cache = _cache(base)
            assert cache["scan_state"] == "ok" and cache["reachable"] is True and cache["root_error"] is None, cache
            _until(lambda: _get(base, "/readyz").json()["loops"]["rescan"]["state"] == "ok", "the loop to recover")
            assert 'data-root="unreachable"' not in _get(base, "/").text
            # Stopped again once scanned: the replica stays ready, `degraded` with the root named (every replica
            # shares the store, and one that went unready would take the dashboard and the reports with it).
            with _stopped(server):
                ready = _until(lambda: (r := _get(base, "/readyz")).json()["roots"]["demo"]["reachable"] is False
                               and r, "readyz to say the scanned root cannot be reached")
                said = ready.json()
                assert ready.status_code == 200 and said["status"] == "degraded", said
                assert "cannot be reached" in said["detail"]["demo"] and endpoint in said["detail"]["demo"], said
                assert _get(base, "/v1/caches/demo/entries").json()["entries"], "the catalog still served"
        finally:
            stop_serve(proc)
    said = log.read_text()
    assert f"cache 'demo': {root} cannot be reached" in said and "Traceback" not in said, said


def _answer(base: str, path: str) -> httpx.Response | None:
    try:
        return _get(base, path)
    except httpx.TransportError:
        return None


@contextlib.contextmanager
def _throttled(upstream: str) -> Iterator[S3Faults]:
    """A proxy in front of moto answering about every third request 503 SlowDown, as S3 throttles."""
    faults, stop = S3Faults(upstream), threading.Event()

    def throttle() -> None:
        armed_at = 0
        while not stop.wait(0.01):
            seen = len(faults.log)
            if faults.pending() == 0 and seen >= armed_at + 2:
                faults.fail(1, 503)
                armed_at = seen + 1

    thread = threading.Thread(target=throttle, daemon=True)
    thread.start()
    try:
        yield faults
    finally:
        stop.set()
        thread.join()
        faults.close()


def test_a_throttling_store_is_slowed_never_shown_unreachable(tmp_path, moto_s3, s3_bucket):
    root = f"s3://{s3_bucket}/jax-cache"
    _put_entries(root, 3)
    with _throttled(moto_s3) as faults:
        env = {"AWS_ENDPOINT_URL": faults.url, "JAXCACHE_REACH_S": "5"}
        done = subprocess.run([str(JAXCACHE), "ls", root, "--json"], capture_output=True, text=True,
                              timeout=CLI_WATCHDOG_S, env=serve_env(**env))
        assert done.returncode == 0 and len(json.loads(done.stdout)["entries"]) == 3, done
        proc, base = start_serve({"demo": root}, f"sqlite:///{tmp_path / 'c.sqlite'}", env=serve_env(**env),
                                 args=("--rescan-s", "0.5", "--workers", "1"))
        try:
            _until(lambda: (r := _answer(base, "/readyz")) is not None and r.status_code == 200, "readiness")
            _until(lambda: _get(base, "/readyz").json()["loops"].get("rescan", {}).get("last_success_s"),
                   "a rescan round to succeed")
            for _ in range(8):  # rescans (every 0.5 s) and looks at the root go on through the throttling
                ready = _get(base, "/readyz").json()
                assert ready["status"] == "ok" and ready["roots"]["demo"]["reachable"] is not False, ready
                assert ready["loops"]["rescan"]["state"] == "ok", ready
                cache = _cache(base)
                assert cache["scan_state"] == "ok" and cache["entries"] == 3, cache
                time.sleep(0.3)
        finally:
            stop_serve(proc)
        assert faults.injected(), "the proxy throttled nothing"
