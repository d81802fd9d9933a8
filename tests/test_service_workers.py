"""`jaxcache serve --workers N`, for real: one listening socket, one worker (the leader) running the background
loops and another taking over when it dies, pages and metrics that agree whichever worker answers, and workers
that die with the serving process.

Requests go out on new connections, which the kernel spreads over the workers' sockets; nothing waits for a time
to pass but for another process to get somewhere (bounded, never asserted on)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import serve_env, start_serve, stop_serve, wait_ready
from jaxcache.service.settings import ServiceSettings
from jaxcache.service.workers import settings_environment
from reports_support import hit, keys_of, run

ADMIN, REPORT, READ = "w-admin", "w-report", "w-read"
PATIENCE_S = 120


def _children(pid: int) -> list[int]:
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


def _leaders(runtime: Path) -> list[int]:
    """The processes holding the leader lock (from the kernel's own table)."""
    found = (runtime / "leader.lock").stat()
    # The machine's whole table: the same inode number on another device is another file.
    ident = (os.major(found.st_dev), os.minor(found.st_dev), found.st_ino)
    holders = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields or fields[1] != "FLOCK":
            continue
        major, minor, inode = fields[5].split(":")
        if (int(major, 16), int(minor, 16), int(inode)) == ident:
            holders.append(int(fields[4]))
    return holders


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
    if not Path("/proc/locks").exists():
        pytest.skip("needs Linux's /proc to see which worker holds the leader lock")
    env = serve_env({ADMIN: "admin", REPORT: "report", READ: "read"}, JAXCACHE_PAGE_CACHE_S="300")
    log = tmp_path / "serve.log"
    proc, base = start_serve({"demo": cache_copy}, f"sqlite:///{tmp_path / 'catalog.sqlite'}", env=env,
                             args=("--workers", "2", "--rescan-s", "3600"), stdout=log.open("w"))
    try:
        wait_ready(proc, base, output=log.read_text, patience_s=PATIENCE_S)
        children = _until(lambda: len(_children(proc.pid)) == 2 and _children(proc.pid), "two workers")
        runtime = Path(_until(lambda: next((p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob(
            "jaxcache-serve-*") if any(_leaders_or_none(p, children))), None), "the runtime directory"))
        yield proc, base, children, runtime
    finally:
        stop_serve(proc)


def _environ(pid: int) -> dict[str, str]:
    pairs = (v.partition(b"=") for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if v)
    return {k.decode(): v.decode() for k, _, v in pairs}


def _leaders_or_none(runtime: Path, workers: list[int]) -> list[int]:
    try:
        return [pid for pid in _leaders(runtime) if pid in workers]
    except FileNotFoundError:
        return []


@pytest.mark.slow
def test_one_worker_leads_the_background_loops_and_another_takes_over_when_it_dies(served):
    proc, base, workers, runtime = served
    (leader,) = _leaders(runtime)
    assert leader in workers
    if "PYTHONMALLOC" not in os.environ:  # the C library's allocator, whose free heap a large rescan hands back
        assert all(b"PYTHONMALLOC=malloc" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                   for pid in workers)
    # The leader's first round rescanned once; the other worker ran none.
    assert _metric(base, 'jaxcache_scan_seconds_count{cache="demo"}') == 1
    for _ in range(6):  # any worker's /readyz shows the leader's loops
        ready = httpx.get(f"{base}/readyz", timeout=30).json()
        assert ready["status"] == "ok" and ready["loops"]["rescan"]["last_success_s"] is not None

    os.kill(leader, signal.SIGKILL)
    survivor = next(pid for pid in workers if pid != leader)
    assert _until(lambda: _leaders(runtime) == [survivor], "the other worker leads")
    # Its first round as leader rescans (a process's first round always does).
    _until(lambda: _metric(base, 'jaxcache_scan_seconds_count{cache="demo"}') == 2, "a second rescan")
    _until(lambda: len(_children(proc.pid)) == 2, "the dead worker replaced")
    assert _leaders(runtime) == [survivor]


@pytest.mark.slow
def test_pages_and_metrics_agree_whichever_worker_answers(served, jax_caches):
    _, base, _, _ = served
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    page = "/v1/caches/demo/entries?limit=1000"

    def hits() -> set[int]:
        seen = set()
        for _ in range(12):  # a new connection each: both workers answer, each from its page cache after once
            body = httpx.get(f"{base}{page}", headers={"Authorization": f"Bearer {READ}"}, timeout=30).json()
            seen.add(next(e["hits"] for e in body["entries"] if e["key"] == train))
        return seen

    before = hits()
    assert len(before) == 1
    posted = httpx.post(f"{base}/v1/reports?cache=demo", content=run("j", "r1", [hit(train, 5, time.time())]).to_json(),
                        headers={"Authorization": f"Bearer {REPORT}", "content-type": "application/json"}, timeout=30)
    assert posted.status_code == 202, posted.text
    # Whichever worker accepted it and the leader's drain folded it, no worker answers its cached page (kept for
    # 300 s) any more.
    _until(lambda: hits() == {before.copy().pop() + 5}, "the hits listed by every worker")

    start = _metric(base, 'jaxcache_request_seconds_count{method="GET",route="/healthz"}')
    for _ in range(20):
        assert httpx.get(f"{base}/healthz", timeout=30).status_code == 200
    for _ in range(4):  # the sum over every worker, whichever answers /metrics
        assert _metric(base, 'jaxcache_request_seconds_count{method="GET",route="/healthz"}') == start + 20


@pytest.mark.slow
def test_every_workers_records_are_folded_by_the_leaders_drain_whoever_leads(served, jax_caches):
    proc, base, workers, runtime = served
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

    (leader,) = _leaders(runtime)
    os.kill(leader, signal.SIGKILL)  # the drain goes with it; the other worker leads and drains from now on
    _until(lambda: _leaders(runtime) not in ([], [leader]), "another worker leading")
    answer = post(run("j", "r2", [hit(train, 1, at)], at=at))
    assert answer.status_code == 202, answer.text
    _until(lambda: hits() == before + 9, "the hit the new leader folded listed")


@pytest.mark.slow
def test_workers_die_with_the_serving_process_and_release_their_locks(served, tmp_path):
    from sqlalchemy.engine import make_url

    from jaxcache.service.catalog.locks import ClusterLocks

    proc, _, workers, runtime = served
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for pid in workers:
        _until(lambda pid=pid: not _alive(pid), f"worker {pid} gone")
    # A process reads as a zombie once its main thread is gone; its files (and locks) go with its last thread.
    _until(lambda: _leaders(runtime) == [], "the leader lock released")
    locks = ClusterLocks(make_url(f"sqlite:///{tmp_path / 'catalog.sqlite'}"))
    try:
        assert locks.get("scan:demo").acquire(blocking=False)
        locks.get("scan:demo").release()
    finally:
        locks.dispose()
        shutil.rmtree(runtime, ignore_errors=True)  # a killed process leaves its runtime directory behind


def test_workers_get_the_settings_the_flags_and_the_environment_gave(tmp_path, monkeypatch):
    settings = ServiceSettings(
        caches={"a": "/tmp/a", "b": "gs://bucket/x"}, host="0.0.0.0", port=0, db="postgresql+psycopg://u:p@h/db",
        workers=3, rescan_s=12.5, tokens={"a" * 64: "admin"}, tokens_file=tmp_path / "tokens",
        insecure_no_auth=True, attest_key="k3y", page_cache_s=0, report_inbox=7)
    for name in list(os.environ):
        if name.startswith("JAXCACHE_"):
            monkeypatch.delenv(name)
    for name, value in settings_environment(settings).items():
        monkeypatch.setenv(name, value)
    again = ServiceSettings()
    assert again.model_dump() == settings.model_dump()
    assert again.catalog_url == settings.catalog_url and again.attest_secret == settings.attest_secret


def test_a_new_service_removes_the_runtime_directories_killed_ones_left(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    from jaxcache.service.supervisor import runtime_directory

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / "jaxcache-serve-left"
    left.mkdir()
    (left / "serving.pid").write_text(dead.stdout.strip())
    running = tmp_path / "jaxcache-serve-running"
    running.mkdir()
    (running / "serving.pid").write_text(str(os.getpid()))
    with runtime_directory() as mine:
        assert not left.exists() and running.exists() and Path(mine).parent == tmp_path
    assert not Path(mine).exists()


def test_a_worker_that_stops_before_it_leads_ends_without_a_traceback(tmp_path, monkeypatch):
    """Ctrl-C while another worker leads: the stopping worker's wait for the lock may end as the leader exits."""
    import asyncio
    import fcntl
    import threading

    from jaxcache.service.workers import Runtime

    failures: list = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    held = os.open(tmp_path / "leader.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another worker leads
    runtime = Runtime(str(tmp_path))

    async def serve_and_stop() -> None:
        async with runtime.loops_when_leader(state=None):
            await asyncio.sleep(0.05)

    asyncio.run(serve_and_stop())
    (waiter,) = [t for t in threading.enumerate() if t.name == "jaxcache-leader"]
    assert waiter.is_alive()  # still waiting for the lock
    os.close(held)  # the leader exits: the lock comes to the stopped worker's waiting thread
    waiter.join(30)
    assert not waiter.is_alive() and failures == []
    assert runtime.leader  # it took the lock on its way out; its process's exit releases it


def test_a_process_that_keeps_exiting_at_once_is_not_started_for_ever(caplog):
    """A worker that dies right after each start (a broken install, a catalog gone) stops the service instead of
    being started again every half second; the signal handlers the supervisor set are put back."""
    from jaxcache.service import supervisor

    before = signal.getsignal(signal.SIGTERM)
    began = time.monotonic()
    assert supervisor.supervise(1, os._exit, (1,)) is False
    assert time.monotonic() - began < PATIENCE_S
    assert f"worker process exited {supervisor.FAST_EXITS} times in a row" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow
def test_the_serving_process_holds_none_of_the_service_once_its_workers_run(served):
    """It checks the settings and migrates the catalog with the whole service imported, then becomes the supervisor
    (the same pid), which imports none of it: about 100 MiB less, whatever the caches hold."""
    proc, _, workers, _ = served
    compiled = ("pydantic_core", "msgspec")  # extension modules every worker loads (in /proc/PID/maps)
    assert all(name in Path(f"/proc/{pid}/maps").read_text() for pid in workers for name in compiled)
    assert not any(name in Path(f"/proc/{proc.pid}/maps").read_text() for name in compiled)
    command = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
    assert command[command.index(b"--") + 2] == b"serve"  # as given, for `ps` and `pkill -f "jaxcache serve"`


def test_a_worker_does_not_migrate_the_catalog_again(tmp_path, cache_copy):
    """The serving process migrated it before any worker started; alembic would cost each worker 10 MiB."""
    import subprocess
    import sys

    db = f"sqlite:///{tmp_path / 'catalog.sqlite'}"
    build = ("import sys; from jaxcache.service.app import create_app; from jaxcache.service.settings import "
             f"ServiceSettings; from jaxcache.service.workers import Runtime; s = ServiceSettings(caches={{'demo': "
             f"{str(cache_copy)!r}}}, db={db!r}); app = create_app(s RUNTIME); "
             "print('alembic' in sys.modules, len(app.state.jaxcache.caches()))")
    env = serve_env()
    (tmp_path / "runtime").mkdir()
    for runtime, expected in (("", "True 1"), (f", runtime=Runtime({str(tmp_path / 'runtime')!r})", "False 1")):
        done = subprocess.run([sys.executable, "-c", build.replace(" RUNTIME", runtime)], env=env,
                              capture_output=True, text=True, timeout=PATIENCE_S)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[-2] == expected


def test_a_supervisor_that_cannot_start_is_a_clear_error(tmp_path, monkeypatch):
    import socket
    import sys

    from jaxcache.errors import JaxcacheError
    from jaxcache.service.supervisor import become

    monkeypatch.setattr(sys, "executable", str(tmp_path / "gone" / "python"))
    with socket.socket() as sock, pytest.raises(JaxcacheError, match="--workers 1"):
        become(sock, "127.0.0.1", 2)


def test_the_supervisors_exit_statuses_are_uvicorns_and_the_clis():
    """Copied, not imported: importing uvicorn and the CLI would cost the supervisor 17 MiB."""
    from uvicorn.config import STARTUP_FAILURE

    from jaxcache.cli.output import EXIT_USAGE
    from jaxcache.service import supervisor

    assert (supervisor.STARTUP_FAILURE, supervisor.EXIT_ERROR) == (STARTUP_FAILURE, EXIT_USAGE)
