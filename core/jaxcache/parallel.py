"""Ordered, bounded concurrency: threads for I/O-bound work (many small object-store reads), forked processes for work
the interpreter lock serialises (decompressing heads, a whole directory's stat calls)."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Future

T = TypeVar("T")
R = TypeVar("R")


def bounded_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int) -> Iterator[R]:
    """Like ``map(fn, items)`` but ``workers`` calls run at once; results keep input order.

    At most ``2 * workers`` items are in flight, so memory stays flat however long ``items`` is.
    With ``workers <= 1`` it is a plain lazy ``map`` (no threads).
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    # Imported here: a directory's scans run without threads, and concurrent.futures (with logging) is a good part
    # of what starting `jaxcache ls` imports.
    from concurrent.futures import ThreadPoolExecutor

    window: collections.deque[Future[R]] = collections.deque()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jaxcache-io") as pool:
        try:
            for item in items:
                window.append(pool.submit(fn, item))
                if len(window) >= 2 * workers:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for fut in window:
                fut.cancel()


#: The work a forked pool's workers run: set before the fork, so that it is inherited rather than pickled.
_forked_task: Callable[[list[Any]], Any] | None = None


def _run_forked(chunk: list[Any]) -> Any:
    assert _forked_task is not None
    return _forked_task(chunk)


def _quiet_worker() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to report, once


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    import os

    getaffinity = getattr(os, "sched_getaffinity", None)
    return len(getaffinity(0)) if getaffinity is not None else (os.cpu_count() or 1)


def forked_chunks(task: Callable[[list[T]], R], items: list[T], *, chunk: int, workers: int) -> Iterator[R]:
    """``task`` over ``items`` in chunks of ``chunk``, results in order, in ``workers`` forked processes: for
    CPU-bound Python (decompressing 100k heads) that threads cannot share. Runs in this process instead where
    forking is not safe or not worth it: one worker, one chunk, no ``fork`` on this platform, or other threads
    running (a fork copies their locks as they are)."""
    import threading

    chunks = [items[i : i + chunk] for i in range(0, len(items), chunk)]
    if workers < 2 or len(chunks) < 2 or threading.active_count() > 1:
        yield from map(task, chunks)
        return
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        yield from map(task, chunks)
        return
    global _forked_task
    _forked_task = task
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(chunks)), initializer=_quiet_worker) as pool:
            yield from pool.imap(_run_forked, chunks)
    finally:
        _forked_task = None


def forked_half(
    task: Callable[[list[T]], list[Any]], items: list[T], *, min_items: int, per_item: int = 1
) -> list[Any]:
    """``task(items)``, the second half of ``items`` done meanwhile by one forked child, its results (msgpack
    values: tuples come back as lists) through a pipe: for system calls over a whole directory, which a second CPU
    speeds up and threads do not (each call takes the interpreter lock back). ``task`` gives ``per_item`` values
    for each item, in order. In this process alone under ``min_items``, with one usable CPU, without ``fork``, or
    with other threads running; a child that fails leaves its half to this process, so errors are this process's
    own."""
    import os
    import threading

    half = len(items) // 2
    if len(items) < min_items or usable_cpus() < 2 or not hasattr(os, "fork") or threading.active_count() > 1:
        return task(items)
    import msgspec

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its half, then out at once (no atexit handlers, no flush of the parent's buffers)
        code = 1
        try:
            os.close(read_end)
            data = msgspec.msgpack.encode(task(items[half:]))
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        mine = task(items[:half])
    finally:
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
    theirs = None
    if os.waitstatus_to_exitcode(status) == 0:
        with contextlib.suppress(msgspec.DecodeError):
            theirs = msgspec.msgpack.decode(data)
    if not isinstance(theirs, list) or len(theirs) != (len(items) - half) * per_item:
        theirs = task(items[half:])
    return mine + theirs
