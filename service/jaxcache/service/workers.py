"""``jaxcache serve --workers N``, a worker's side: N worker processes listening on one port (a socket each,
SO_REUSEPORT), each the whole app, watched by the serving process (:mod:`~jaxcache.service.supervisor`) and sharing
a runtime directory that it creates and removes: the leader
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
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jaxcache.service.generations import SharedGenerations
from jaxcache.service.settings import ServiceSettings
from jaxcache.service.tasks.health import LoopStatus

log = logging.getLogger("jaxcache.service")


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
        return {name: LoopStatus.from_dict(status) for name, status in data.items()}


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
