"""``jaxcache serve`` for the report storm (bench/reports.py): one process, or ``--role api`` beside one
``--role loops``; and waiting for its background loops to settle before a storm."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from api import _free_port, wait_ready


@contextlib.contextmanager
def service(root: str, db: str, work: str, workers: int | None,
            split: bool = False) -> Iterator[tuple[str, list[int], str]]:
    """``jaxcache serve`` (``split``: ``--role api`` with ``workers``, beside a ``--role loops`` process); its
    address, the pids of the ``jaxcache serve`` processes (with their workers, the service's CPU) and the address
    of the one running the loops."""
    if split:
        with _serve(root, db, work, 1, role="loops") as (loops, loops_pid), \
                _serve(root, db, work, workers, role="api") as (base, api_pid):
            yield base, [api_pid, loops_pid], loops
        return
    with _serve(root, db, work, workers) as (base, pid):
        yield base, [pid], base


@contextlib.contextmanager
def _serve(root: str, db: str, work: str, workers: int | None, role: str = "all") -> Iterator[tuple[str, int]]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    exe = os.path.join(os.path.dirname(sys.executable), "jaxcache")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}
    cmd = [exe, "serve", "--cache", f"bench={root}", "--port", str(port), "--rescan-s", "86400", "--db", db,
           "--insecure-no-auth", "--role", role]  # on loopback: a token's check is one hash, nothing to measure
    if workers is not None:
        cmd += ["--workers", str(workers)]
    log = open(os.path.join(work, f"serve-{port}.log"), "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def output() -> str:
            log.flush()
            return open(log.name).read()[-3000:]

        wait_ready(server, base, output)
        try:
            yield base, server.pid
        except BaseException:
            print(f"the service's log ended:\n{output()}", file=sys.stderr)
            raise
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def settle(base: str, timeout_s: float) -> float | None:
    """Wait until the service's background loops have each finished a round (its first integrity pass reads every
    entry of the root, throttled to a fifth of a core, for about a minute here): a storm hits a service that has
    run for a while. Seconds waited, or None if ``timeout_s`` passed first."""
    import httpx

    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        loops = httpx.get(f"{base}/readyz", timeout=30).json().get("loops", {})
        if {"rescan", "verify"} <= set(loops) and all(loop.get("last_success_s") for loop in loops.values()):
            return time.perf_counter() - started
        time.sleep(1)
    return None
