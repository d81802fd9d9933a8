"""Ordered, bounded concurrency for I/O-bound work (many small GCS reads)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

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
