"""What the garbage collector did while a block ran, read from the interpreter itself (``gc.get_stats``,
``gc.callbacks``): whether the service handed memory back (a full collection it asked for), and whether the collector
stayed out of the work it is paused for."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from types import CodeType


class Collections:
    """Collections counted by :func:`full_collections` or :func:`collections_in`."""

    def __init__(self) -> None:
        self.full = 0  # full (generation 2) collections: with automatic collection off, only gc.collect() makes them
        self.inside: set[str] = set()  # the names of the watched functions some collection ran inside


@contextlib.contextmanager
def full_collections() -> Iterator[Collections]:
    """The full collections run in the block, which runs with automatic collection off: each one was asked for
    (``gc.collect()``, as :func:`jaxcache.service.memory.release` does). Counted once the block ends."""
    seen = Collections()
    was_enabled = gc.isenabled()
    gc.disable()
    before = gc.get_stats()[2]["collections"]
    try:
        yield seen
    finally:
        seen.full = gc.get_stats()[2]["collections"] - before
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def collections_in(*functions: object) -> Iterator[Collections]:
    """Every collection in the block (in any thread), the collector made to run at almost every allocation
    (threshold 1), noting which of ``functions`` (by their code) was running when one started."""
    codes: dict[CodeType, str] = {}
    for f in functions:
        codes[f.__code__] = f.__qualname__  # type: ignore[attr-defined]
    seen = Collections()

    def note(phase: str, info: dict) -> None:
        if phase != "start":
            return
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code in codes:
                seen.inside.add(codes[frame.f_code])
            frame = frame.f_back

    threshold = gc.get_threshold()
    gc.set_threshold(1, *threshold[1:])
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*threshold)
