"""``jaxcache serve --workers N``: N worker processes listening on one port (a socket each, SO_REUSEPORT), each the
whole app, watched by the serving process and sharing a runtime directory that it creates and removes: the leader
lock (one worker runs the background loops), the generations of each cache (pages and statistics stay coherent),
the loops' health (every worker's /readyz shows it) and Prometheus's multiprocess files (every worker's /metrics
counts all). docs/service.md, "Serving".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jaxcache.service.generations import SharedGenerations
from jaxcache.service.settings import ServiceSettings
from jaxcache.service.tasks.health import LoopStatus

log = logging.getLogger("jaxcache.service")

#: Set by the serving process for its workers (not settings: nobody sets them by hand).
RUNTIME_ENV = "JAXCACHE_RUNTIME_DIR"
SUPERVISOR_ENV = "JAXCACHE_SUPERVISOR_PID"
#: prometheus_client's own switch: set before a worker imports it, so its metrics live in files there.
PROMETHEUS_ENV = "PROMETHEUS_MULTIPROC_DIR"
class Runtime:
    """A worker's view of the serving process's runtime directory."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self._lock_fd: int | None = None
        self.leader = False

    def generations(self, settings: ServiceSettings) -> SharedGenerations:
        return SharedGenerations(str(self.dir / "generations"), list(settings.caches))

    # ---- the leader --------------------------------------------------------------------------------------

    def _wait_to_lead(self) -> None:
        fd = os.open(self.dir / "leader.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks in the kernel; the lock goes with the process, however it ends
        self._lock_fd, self.leader = fd, True

    @contextlib.asynccontextmanager
    async def loops_when_leader(self, state: Any) -> AsyncIterator[None]:
        """While the app serves: wait to become the leader (the worker holding the lock, the first to ask, or
        the next when it exits), then run the background loops until the app stops."""
        from jaxcache.service.tasks.loops import background

        became: concurrent.futures.Future[None] = concurrent.futures.Future()

        def wait() -> None:
            # Running from the start, so a worker that stops before it leads cannot cancel the future under the
            # thread (which would then raise, with a traceback, when the lock comes to it as its process exits).
            became.set_running_or_notify_cancel()
            try:
                self._wait_to_lead()
                became.set_result(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the task below
                became.set_exception(exc)

        # Not the thread pool: a worker that never leads would hold one of its threads for good.
        threading.Thread(target=wait, name="jaxcache-leader", daemon=True).start()
        stop = asyncio.Event()

        async def lead() -> None:
            await asyncio.wrap_future(became)
            log.info("worker %d runs the background loops (rescans, verification, retention)", os.getpid())
            state.loops.on_change = self.write_loops
            async with background(state):
                await stop.wait()

        task = asyncio.create_task(lead())
        try:
            yield
        finally:
            stop.set()
            if not became.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- what the leader's loops are doing ---------------------------------------------------------------

    def write_loops(self, snapshot: dict[str, LoopStatus]) -> None:
        path = self.dir / "loops.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({name: asdict(status) for name, status in snapshot.items()}))
        tmp.replace(path)

    def read_loops(self) -> dict[str, LoopStatus]:
        try:
            data = json.loads((self.dir / "loops.json").read_text())
        except (OSError, ValueError):  # no round finished yet
            return {}
        return {name: LoopStatus(**status) for name, status in data.items()}


def die_with_parent(supervisor: int) -> None:
    """Killed (SIGKILL) the moment the serving process dies, as it would be were it one process: a worker left
    behind would hold its locks and serve alone. On Linux the kernel does it; elsewhere a thread watches."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        def watch() -> None:
            while os.getppid() == supervisor:
                threading.Event().wait(1.0)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="jaxcache-parent-watch", daemon=True).start()
    if os.getppid() != supervisor:  # it died before we asked
        os.kill(os.getpid(), signal.SIGKILL)


def settings_environment(settings: ServiceSettings) -> dict[str, str]:
    """``settings`` as the ``JAXCACHE_*`` variables that give a worker the same settings (flags included)."""
    env: dict[str, str] = {}
    for name in ServiceSettings.model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if isinstance(value, dict):
            text = json.dumps(value)
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        env[f"JAXCACHE_{name.upper()}"] = text
    return env


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


_PREFIX = "jaxcache-serve-"


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


#: A process that exits within this long of its start, this many times in a row, is not started again: it would
#: fail the same way (its error repeated every half second), so the service stops and says so.
FAST_EXIT_S, FAST_EXITS = 10.0, 5


def supervise(count: int, target: Callable[..., None], args: tuple, *,
              writer: Callable[[], None] | None = None, writer_env: Mapping[str, str] | None = None) -> bool:
    """Run ``count`` processes of ``target(*args)`` (spawned: a fresh interpreter each), and one of ``writer``
    (the report writer) before them, until SIGINT or SIGTERM, starting another for one that exits; stop the
    workers (SIGTERM, then wait), then the writer, which ingests what they handed it; return False as soon as one
    exits with uvicorn's startup failure, or one keeps exiting at once (the next would fail the same way).
    ``writer_env``: variables the writer's environment has besides the workers'."""
    import multiprocessing
    import time

    from uvicorn.config import STARTUP_FAILURE

    spawn = multiprocessing.get_context("spawn")
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}

    def start(body: Callable[..., None], body_args: tuple, name: str) -> Any:
        process = spawn.Process(target=body, args=body_args, name=name)
        extra = dict(writer_env or {}) if body is writer else {}
        before = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)  # a spawned child takes the environment as it is when it starts
        try:
            process.start()
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return process

    kinds = [(writer, (), "jaxcache-writer")] if writer is not None else []
    kinds += [(target, args, "jaxcache-worker")] * count
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
    first = 1 if writer is not None else 0
    for group in (processes[first:], processes[:first]):  # the workers, then the writer
        for process in group:
            if process.exitcode is None:
                process.terminate()
        for process in group:
            process.join()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    return started
