"""The threads a request hands its blocking work to: asyncio's own executors, one for each kind of work, so that
each kind is bounded on its own and none waits behind another. Parsing reports is background work: its thread
runs at a lower CPU priority than the rest of the service.

Not anyio's ``to_thread``: its limiter and checkpoints take several turns of the event loop for each hop, which
was a large part of a 304's cost (bench/README.md, "A request's thread hop")."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("jaxcache.service")

#: Threads for the catalog reads requests wait on. More only queued on the interpreter lock: each SQLite step hands
#: it over, and a thread back from the database waits for it behind the others (bench/README.md, "Threads for
#: listings").
READ_THREADS = 2
#: How much lower the parsing thread's priority is than the process's, as ``nice`` lowers a command's by default. A
#: record accepted faster than the drain folds it only waits in the inbox, and the CPU its parsing took delayed the
#: drain and every other request: under a storm of reports on 2 cores, without it the API parsed ahead and the
#: drain folded the rest alone afterwards (bench/README.md, "Background priority for parsing").
BACKGROUND_NICE = 10


class Threads:
    """One process's threads for requests' blocking work. Each executor starts its threads at its first use, and
    they end with it."""

    def __init__(self) -> None:
        """A process stores one record at a time, on either catalog: SQLite takes one writer at a time, and on
        PostgreSQL a store is a few short round trips, so that more threads storing at once only contended for the
        interpreter lock. The others wait in the executor's queue; workers and replicas store in parallel
        (bench/README.md, "One store at a time on PostgreSQL too")."""
        self._read = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="jaxcache-read")
        self._parse = ThreadPoolExecutor(1, thread_name_prefix="jaxcache-parse", initializer=_in_background)
        self._store = ThreadPoolExecutor(1, thread_name_prefix="jaxcache-store")
        self._parsing = asyncio.Semaphore(1)

    async def read(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)``, a catalog read a request waits for, in one of :data:`READ_THREADS` threads."""
        return await _run(self._read, work, args)

    async def parse(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)``, parsing a request's body: one at a time, as each thread more parsing at once took the
        interpreter lock from the event loop (/healthz) and from the drain. The next is handed over only once the
        loop has taken the last one back: a thread parsing bodies back to back holds the interpreter lock, and the
        loop waits for it at each of its system calls (bench/README.md, "A request's thread hop")."""
        async with self._parsing:
            return await _run(self._parse, work, args)

    async def store(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)``, a write a request waits for, apart from parsing: on SQLite it waits for the database's
        write lock, which a drain's pass holds, and the next record's parsing need not wait for that. One thread."""
        return await _run(self._store, work, args)


async def _run(pool: ThreadPoolExecutor, work: Callable[..., T], args: tuple[Any, ...]) -> T:
    # In a copy of the caller's context, as asyncio.to_thread runs its work.
    call = functools.partial(contextvars.copy_context().run, work, *args)
    return await asyncio.get_running_loop().run_in_executor(pool, call)


def _in_background() -> None:
    """Lower the calling thread's CPU priority by BACKGROUND_NICE. Linux only: there a thread has a niceness of its
    own, where elsewhere it would be the whole process's."""
    if not sys.platform.startswith("linux"):
        return
    me = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + BACKGROUND_NICE))
    except OSError as exc:  # a sandbox that forbids it: parsing still works, at the process's priority
        log.info("report parsing runs at the service's own CPU priority: %s", exc)
