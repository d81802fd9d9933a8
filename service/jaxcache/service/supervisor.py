"""The serving process of ``jaxcache serve --workers N`` once its workers run: it holds the port, starts the workers
(spawned), starts another for one that exits, and stops them all on SIGINT or SIGTERM.

The process that checked the settings, the catalog and the roots had the whole service imported (about 100 MiB,
a fifth of the service's memory at a million entries) only to wait on its children afterwards, so it replaces
itself (``exec``, same pid) with this module, which imports the standard library alone. The workers import what
they need themselves. docs/service.md, "Serving".
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jaxcache.errors import JaxcacheError  # itself imports only the standard library

log = logging.getLogger("jaxcache.service")

#: Set by the serving process for its workers (not settings: nobody sets them by hand).
RUNTIME_ENV = "JAXCACHE_RUNTIME_DIR"
SUPERVISOR_ENV = "JAXCACHE_SUPERVISOR_PID"
#: prometheus_client's own switch: set before a worker imports it, so its metrics live in files there.
PROMETHEUS_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: uvicorn's exit status for a server that could not start (``uvicorn.config.STARTUP_FAILURE``; importing uvicorn
#: here would cost this process 13 MiB).
STARTUP_FAILURE = 3
#: A process that exits within this long of its start, this many times in a row, is not started again: it would
#: fail the same way (its error repeated every half second), so the service stops and says so.
FAST_EXIT_S, FAST_EXITS = 10.0, 5
#: The exit status of ``jaxcache`` for an error it explains (``jaxcache.cli.output.EXIT_USAGE``).
EXIT_ERROR = 2

_PREFIX = "jaxcache-serve-"


def become(sock: socket.socket, host: str, workers: int) -> None:
    """Replace this process (same pid, same standard streams) with the supervisor of ``workers`` workers on
    ``sock``'s port (bound, held for them). The environment must already give the workers their settings."""
    sock.set_inheritable(True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    code = "from jaxcache.service.supervisor import main; main()"
    # -P: not the working directory on the import path (of this process, and of the workers it spawns). The
    # command as it was given stays on the command line (after "--"), for `ps` and `pkill -f`.
    try:
        os.execv(sys.executable, [sys.executable, "-P", "-c", code, str(sock.fileno()), host, str(workers), "--",
                                  *sys.argv])
    except OSError as exc:
        raise JaxcacheError(f"cannot start the workers' supervisor with {sys.executable or 'this Python'} "
                            f"({exc.strerror or exc}): run `jaxcache serve --workers 1` to serve in this process"
                            ) from None


def main() -> None:
    """The supervisor's body (after :func:`become`); arguments: the port's socket fd, the host, the workers, then
    "--" and the command that became it."""
    fd, host, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    sock = socket.socket(fileno=fd)  # held (bound, not listening) while the workers serve: the port stays ours
    port = sock.getsockname()[1]
    with runtime_directory() as runtime:
        # Spawned workers inherit this environment: the settings (flags included), and where to share.
        os.environ[RUNTIME_ENV] = runtime
        os.environ[SUPERVISOR_ENV] = str(os.getpid())
        os.environ[PROMETHEUS_ENV] = os.path.join(runtime, "metrics")
        # The C library's allocator for the workers, unless the operator chose one: after a rescan of a million
        # entries, Python's own kept hundreds of MiB of its arenas pinned by a few live objects each, which
        # malloc_trim (tasks/memory.py) can hand back from the C library's heap.
        os.environ.setdefault("PYTHONMALLOC", "malloc")
        started = supervise(count, run_worker, (host, port))
    sock.close()
    if not started:
        print("jaxcache: error: a worker process could not start, or kept exiting at once "
              "(its error is above); the service stopped", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_ERROR)


def _call(target: str, *args: Any) -> None:
    """A spawned process's body: ``target`` ("module:function") imported there, never in this process."""
    module, _, name = target.partition(":")
    getattr(importlib.import_module(module), name)(*args)


run_worker = functools.partial(_call, "jaxcache.service.server:run_worker")


@contextlib.contextmanager
def runtime_directory() -> Iterator[str]:
    """A private directory for one `jaxcache serve`'s workers, removed when it stops."""
    import shutil
    import tempfile

    _sweep(Path(tempfile.gettempdir()))
    directory = tempfile.mkdtemp(prefix=_PREFIX)
    os.mkdir(os.path.join(directory, "metrics"))
    (Path(directory) / "serving.pid").write_text(str(os.getpid()))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _sweep(tmp: Path) -> None:
    """Remove the runtime directories of serving processes that were killed (they could not remove their own)."""
    import shutil

    for directory in tmp.glob(f"{_PREFIX}*"):
        try:
            pid = int((directory / "serving.pid").read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, ValueError):  # another user's, or one still starting: not ours to judge
            continue


def supervise(count: int, target: Callable[..., None], args: tuple) -> bool:
    """Run ``count`` processes of ``target(*args)`` (spawned: a fresh interpreter each) until SIGINT or SIGTERM,
    starting another for one that exits; stop them (SIGTERM, then wait); return False as soon as one exits with
    uvicorn's startup failure, or one keeps exiting at once (the next would fail the same way)."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}

    def start(body: Callable[..., None], body_args: tuple, name: str) -> Any:
        process = spawn.Process(target=body, args=body_args, name=name)
        process.start()
        return process

    kinds = [(target, args, "jaxcache-worker")] * count
    processes = [start(*kind) for kind in kinds]
    since = [time.monotonic()] * len(kinds)  # when each slot's process started
    fast = [0] * len(kinds)  # exits in a row, each within FAST_EXIT_S of its start
    started = True
    while not stop.wait(0.5):
        for i, process in enumerate(processes):
            if process.exitcode is None:
                continue
            what = kinds[i][2].removeprefix("jaxcache-")
            fast[i] = fast[i] + 1 if time.monotonic() - since[i] < FAST_EXIT_S else 0
            if process.exitcode == STARTUP_FAILURE or fast[i] >= FAST_EXITS:
                if fast[i] >= FAST_EXITS:
                    log.error("%s process exited %d times in a row within %g s of its start (last: %s): not "
                              "starting another", what, fast[i], FAST_EXIT_S, process.exitcode)
                started = False
                stop.set()
                break
            log.warning("%s process %d exited (%s): starting another", what, process.pid, process.exitcode)
            processes[i], since[i] = start(*kinds[i]), time.monotonic()
    for process in processes:
        if process.exitcode is None:
            process.terminate()
    for process in processes:
        process.join()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    return started
