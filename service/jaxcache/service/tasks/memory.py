"""Giving the memory of a large rescan back to the system.

A rescan of a million entries builds and drops millions of small objects, some in reference cycles that only the
collector's rare full pass frees, and glibc keeps the freed heap for the process. Measured at 1M entries, one
process after its first rescan: 914 MiB resident, 595 after a full collection, 376 after ``malloc_trim``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable

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
