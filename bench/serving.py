"""``jaxcache serve`` for the benches: one process tree, or ``--role api`` beside one ``--role loops``
(bench/reports.py); waiting until it is ready, and until its background loops have settled."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def service(root: str, db: str, work: str, workers: int | None, split: bool = False,
            cpus: str | None = None) -> Iterator[tuple[str, list[int], str]]:
    """``jaxcache serve`` (``split``: ``--role api`` with ``workers``, beside a ``--role loops`` process; ``cpus``:
    pinned to those CPUs); its address, the pids of the ``jaxcache serve`` processes (with their workers, the
    service's CPU) and the address of the one running the loops."""
    if split:
        with serve(root, db, work, 1, role="loops", cpus=cpus) as (loops, loops_pid), \
                serve(root, db, work, workers, role="api", cpus=cpus) as (base, api_pid):
            yield base, [api_pid, loops_pid], loops
        return
    with serve(root, db, work, workers, cpus=cpus) as (base, pid):
        yield base, [pid], base


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(server: subprocess.Popen, base: str, output: Callable[[], str]) -> None:
    """Until ``GET /readyz`` answers 200; exits with ``output()`` if the service exits first."""
    import httpx

    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if server.poll() is not None:
            sys.exit(f"error: the service exited before it was ready\n{output()}".rstrip())
        time.sleep(0.5)


@contextlib.contextmanager
def serve(root: str, db: str, work: str, workers: int | None, role: str = "all",
          env: dict[str, str] | None = None, cpus: str | None = None) -> Iterator[tuple[str, int]]:
    """``jaxcache serve --cache bench=ROOT`` on a free port, ready; its address and pid. ``env``: more variables;
    ``cpus``: a CPU list (``taskset -c``) the service and its workers run on, apart from the load."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}, **(env or {})}
    # `python -m jaxcache`: this interpreter's jaxcache, also where no `jaxcache` script was installed beside it.
    # No auth: on loopback a token's check is one hash, nothing to measure.
    cmd = [sys.executable, "-m", "jaxcache", "serve", "--cache", f"bench={root}", "--port", str(port), "--rescan-s",
           "86400", "--db", db, "--insecure-no-auth", "--role", role]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]  # exec'd in place: the pid is still the service's
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
