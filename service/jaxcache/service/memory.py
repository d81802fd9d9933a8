"""Handing a large rescan's memory back (a full collection frees its cycles, then ``malloc_trim`` glibc's heap),
and keeping the collector out of work that makes a million objects."""

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
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # glibc only (not musl)
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim() if sys.platform.startswith("linux") else None


def release() -> None:
    """Free unreachable cycles now and hand free heap pages back to the system where the C library can."""
    gc.collect()
    if _trim is not None:
        _trim(0)


def settle_startup() -> None:
    """``gc.freeze`` what a started process holds for good, so the collector's full passes stop walking it."""
    gc.collect()
    gc.freeze()


_paused = 0
_pausing = threading.Lock()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection in the block, in any thread (blocks may nest): full passes would walk its objects."""
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
