"""Giving the memory of a large rescan back to the system, and keeping the collector out of work that makes a
million objects.

A rescan of a million entries builds and drops millions of small objects, some in reference cycles that only the
collector's rare full pass frees, and glibc keeps the freed heap for the process: a full collection, then
``malloc_trim``, hand most of it back (bench/README.md, "Memory after a rescan of a million entries").
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import sys
import threading
from collections.abc import Callable, Iterator

#: Rescans of fewer entries leave too little to be worth a full collection.
RELEASE_FROM_ENTRIES = 100_000


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # glibc only (not musl)
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


def release() -> None:
    """Free unreachable cycles now and hand free heap pages back to the system where the C library can."""
    gc.collect()
    if _trim is not None:
        _trim(0)


def settle_startup() -> None:
    """Put what a started process holds for good (modules, the app, its settings and catalog) out of the
    collector's reach (``gc.freeze``): each full pass walked all of it again, and a report storm, whose records
    wait for the writer long enough to grow old, made a pass every few requests (a worker spent 12% of a storm in
    the collector)."""
    gc.collect()
    gc.freeze()


_paused = 0
_pausing = threading.Lock()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection while the block runs (in any thread of the process), for work that makes a million
    objects and no cycles: each of the collector's full passes would walk them all again, a quarter of a prune
    plan's time at 1M entries. Blocks may nest and overlap across threads; the last to end turns it back on."""
    global _paused
    with _pausing:
        ours = _paused > 0 or gc.isenabled()  # else turned off by someone else: theirs to turn on
        if ours:
            _paused += 1
            gc.disable()
    try:
        yield
    finally:
        if ours:
            with _pausing:
                _paused -= 1
                if _paused == 0:
                    gc.enable()
