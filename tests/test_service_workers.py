"""`jaxcache serve --workers N`, for real: uvicorn's worker processes on one port, each the whole app; each
background pass claimed by its loop's lock so that it runs in one process at a time; `/readyz`, pages and metrics
that agree whichever worker answers; a killed worker replaced by uvicorn.

Requests go out on new connections, which any worker may accept; nothing waits for a time to pass but for another
process to get somewhere (bounded, never asserted on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from conftest import serve_env, start_serve, stop_serve, wait_ready
from jaxcache.service.catalog.coordination import ClusterLocks
from reports_support import hit, keys_of, run

ADMIN, REPORT, READ = "w-admin", "w-report", "w-read"
PATIENCE_S = 120


def _workers(pid: int) -> list[int]:
    """The serving process's workers (not multiprocessing's resource tracker beside them)."""
    found = Path(f"/proc/{pid}/task/{pid}/children")
    pids = [int(p) for p in found.read_text().split()] if found.exists() else []
    return [p for p in pids if _alive(p) and b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _until(condition, what: str):
    deadline = time.monotonic() + PATIENCE_S
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def _metric(base: str, prefix: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture
def served(tmp_path, cache_copy):
    if not Path("/proc/self/task").exists():
        pytest.skip("needs Linux's /proc to find the worker processes")
    env = serve_env({ADMIN: "admin", REPORT: "report", READ: "read"})
    log = tmp_path / "serve.log"
    proc, base = start_serve({"demo": cache_copy}, f"sqlite:///{tmp_path / 'catalog.sqlite'}", env=env,
                             args=("--workers", "2", "--rescan-s", "3600"), stdout=log.open("w"))
    try:
        wait_ready(proc, base, output=log.read_text, patience_s=PATIENCE_S)
        workers = _until(lambda: len(_workers(proc.pid)) == 2 and _workers(proc.pid), "two workers")
        yield proc, base, workers, log
    finally:
        stop_serve(proc)


@pytest.mark.slow
def test_uvicorns_workers_serve_and_a_killed_one_is_replaced(served):
    proc, base, workers, _ = served
    if "PYTHONMALLOC" not in os.environ:  # the C library's allocator, whose free heap a large rescan hands back
        assert all(b"PYTHONMALLOC=malloc" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                   for pid in workers)
    _until(lambda: httpx.get(f"{base}/readyz", timeout=30).json()["loops"].get("rescan", {}).get("last_success_s"),
           "the first round of rescans to end")
    for _ in range(6):  # any worker's /readyz shows every loop, whichever worker ran its last pass
        ready = httpx.get(f"{base}/readyz", timeout=30).json()
        assert ready["status"] == "ok" and ready["loops"]["rescan"]["last_success_s"] is not None
        assert set(ready["loops"]) == {"drain", "rescan", "verify"}

    os.kill(workers[0], signal.SIGKILL)
    replaced = _until(lambda: len(now := _workers(proc.pid)) == 2 and workers[0] not in now and now,
                      "the killed worker replaced")
    assert workers[1] in replaced
    for _ in range(6):
        assert httpx.get(f"{base}/readyz", timeout=30).status_code == 200


@pytest.mark.slow
def test_pages_and_metrics_agree_whichever_worker_answers(served, jax_caches):
    _, base, _, _ = served
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    page = "/v1/caches/demo/entries?limit=1000"
    read = {"Authorization": f"Bearer {READ}"}

    def answers() -> set[tuple[int, str]]:
        seen = set()
        for _ in range(12):  # a new connection each: both workers answer
            got = httpx.get(f"{base}{page}", headers=read, timeout=30)
            seen.add((next(e["hits"] for e in got.json()["entries"] if e["key"] == train), got.headers["etag"]))
        return seen

    before = answers()
    assert len(before) == 1
    (hits, tag), = before
    # Revalidated by either worker: unchanged, so 304 without the page.
    for _ in range(6):
        again = httpx.get(f"{base}{page}", headers={**read, "If-None-Match": tag}, timeout=30)
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == tag
    posted = httpx.post(f"{base}/v1/reports?cache=demo", content=run("j", "r1", [hit(train, 5, time.time())]).to_json(),
                        headers={"Authorization": f"Bearer {REPORT}", "content-type": "application/json"}, timeout=30)
    assert posted.status_code == 202, posted.text
    # Whichever worker accepted it and whichever folded it, every worker answers the new figures, under a new tag.
    after = _until(lambda: (found := answers()) and len(found) == 1 and next(iter(found))[0] == hits + 5 and found,
                   "the hits listed by every worker")
    new_tag = next(iter(after))[1]
    assert new_tag != tag
    assert httpx.get(f"{base}{page}", headers={**read, "If-None-Match": tag}, timeout=30).status_code == 200

    start = _metric(base, 'jaxcache_request_seconds_count{method="GET",route="/healthz"}')
    for _ in range(20):
        assert httpx.get(f"{base}/healthz", timeout=30).status_code == 200
    for _ in range(4):  # the sum over every worker, whichever answers /metrics
        assert _metric(base, 'jaxcache_request_seconds_count{method="GET",route="/healthz"}') == start + 20


@pytest.mark.slow
def test_every_workers_records_are_folded_whichever_worker_drains(served, jax_caches):
    proc, base, workers, _ = served
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    at = time.time()

    def post(record) -> httpx.Response:
        return httpx.post(f"{base}/v1/reports?cache=demo", content=record.to_json(), timeout=PATIENCE_S,
                          headers={"Authorization": f"Bearer {REPORT}", "content-type": "application/json"})

    def hits() -> int:
        body = httpx.get(f"{base}/v1/caches/demo/entries?limit=1000", timeout=30,
                         headers={"Authorization": f"Bearer {READ}"}).json()
        return next(e["hits"] for e in body["entries"] if e["key"] == train)

    before = hits()
    records = [run("j", "r1", [hit(train, 1, at)], at=at, process_index=p, process_count=8) for p in range(8)]
    with ThreadPoolExecutor(8) as pool:  # a new connection each: both workers accept records into the inbox
        answers = list(pool.map(post, records))
    assert [(a.status_code, a.json()["process_index"]) for a in answers] == [(202, p) for p in range(8)]
    _until(lambda: hits() == before + 8, "the eight hits listed")

    os.kill(workers[0], signal.SIGKILL)  # whatever pass it held, its lock goes with it
    _until(lambda: len(_workers(proc.pid)) == 2 and workers[0] not in _workers(proc.pid), "a new worker")
    answer = post(run("j", "r2", [hit(train, 1, at)], at=at))
    assert answer.status_code == 202, answer.text
    _until(lambda: hits() == before + 9, "the hit folded after the kill listed")


@pytest.mark.slow
def test_sigterm_stops_the_workers_and_releases_their_locks(served, tmp_path):
    proc, _, workers, log = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=PATIENCE_S) == 0, log.read_text()
    for pid in workers:
        _until(lambda pid=pid: not _alive(pid), f"worker {pid} gone")
    locks = ClusterLocks(make_url(f"sqlite:///{tmp_path / 'catalog.sqlite'}"))
    try:
        for name in ("scan:demo", "loop:rescan", "loop:drain", "loop:verify"):
            assert locks.get(name).acquire(blocking=False), name
            locks.get(name).release()
    finally:
        locks.dispose()


def test_a_worker_does_not_migrate_the_catalog_again(tmp_path, cache_copy):
    """The serving process migrated it before any worker started; alembic would cost each worker 10 MiB."""
    db = f"sqlite:///{tmp_path / 'catalog.sqlite'}"
    build = ("import sys; from jaxcache.service.server import worker_app; from jaxcache.service.app import "
             "create_app; from jaxcache.service.caches import summary; from jaxcache.service.settings import "
             "ServiceSettings; s = ServiceSettings(caches="
             f"{{'demo': {str(cache_copy)!r}}}, db={db!r}); app = BUILD; "
             "print('alembic' in sys.modules, len(summary.caches(app.state.jaxcache)))")
    for how, expected in (("create_app(s)", "True 1"), ("worker_app(s)", "False 1")):
        done = subprocess.run([sys.executable, "-c", build.replace("BUILD", how)], env=serve_env(),
                              capture_output=True, text=True, timeout=PATIENCE_S)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[-2] == expected


def test_a_worker_that_cannot_build_the_app_stops_the_service_with_one_line(tmp_path, cache_copy):
    """What the serving process checked changed before a worker started (here: the catalog is gone and its
    directory is a file): one line, uvicorn's startup failure, and no worker started again and again."""
    blocked = tmp_path / "blocked"
    blocked.write_text("not a directory")
    build = ("from jaxcache.service.server import worker_app; from jaxcache.service.settings import "
             f"ServiceSettings; worker_app(ServiceSettings(caches={{'demo': {str(cache_copy)!r}}}, "
             f"db='sqlite:///{blocked}/catalog.sqlite'))")
    done = subprocess.run([sys.executable, "-c", build], env=serve_env(), capture_output=True, text=True,
                          timeout=PATIENCE_S)
    from uvicorn.config import STARTUP_FAILURE

    assert done.returncode == STARTUP_FAILURE, done.stderr
    assert done.stderr.startswith("jaxcache: error: ") and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_a_second_service_on_the_workers_port_is_refused_and_the_first_keeps_it(served, tmp_path, cache_copy):
    """The workers' sockets share the port (SO_REUSEPORT): another `jaxcache serve --workers 2` on it must fail
    with one line, not join them and take part of the first service's connections."""
    proc, base, _, _ = served
    port = base.rsplit(":", 1)[1]
    second = subprocess.run(
        [str(Path(sys.executable).with_name("jaxcache")), "serve", "--workers", "2", "--port", port,
         "--db", f"sqlite:///{tmp_path / 'other.sqlite'}", "--cache", f"demo={cache_copy}"],
        env=serve_env(), capture_output=True, text=True, timeout=PATIENCE_S)
    said = second.stdout + second.stderr
    assert second.returncode != 0 and f"cannot listen on 127.0.0.1:{port}" in said, said
    assert "Traceback" not in said, said
    for _ in range(6):  # new connections each: every one still reaches the first service
        assert httpx.get(f"{base}/readyz", timeout=30).status_code == 200
    assert proc.poll() is None
