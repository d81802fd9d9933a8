"""How many times each cache has changed, by what changed: what cached pages and statistics are checked against.

``ENTRIES`` moves when entry rows change (a rescan that found something, a prune, a DELETE), ``USAGE`` when run
records arrive (or are compacted). A process's own counters (:class:`LocalGenerations`), or one memory-mapped
file that every worker process of one ``jaxcache serve`` shares (:class:`SharedGenerations`): a change one worker
makes drops every worker's pages and statistics of the cache at once. Counters only grow, so a value read once
and read again equal means nothing changed in between.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
from collections.abc import Sequence
from typing import Protocol

ENTRIES, USAGE = 0, 1
_KINDS = 2
_SLOT = struct.Struct("<Q")


class Generations(Protocol):
    def get(self, cache: str, what: int) -> int: ...

    def bump(self, cache: str, what: int) -> None: ...


class LocalGenerations:
    """This process's counters."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def get(self, cache: str, what: int) -> int:
        return self._counts.get((cache, what), 0)

    def bump(self, cache: str, what: int) -> None:
        with self._lock:
            self._counts[(cache, what)] = self._counts.get((cache, what), 0) + 1


class SharedGenerations:
    """Counters in ``path``, one 8-byte slot per (cache, kind) in the order of ``caches`` (every worker is given
    the same settings). Reads take no lock (an aligned 8-byte read); increments lock the file, so none is lost."""

    def __init__(self, path: str, caches: Sequence[str]) -> None:
        self._slots = {name: i for i, name in enumerate(caches)}
        size = max(1, len(caches)) * _KINDS * _SLOT.size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            if os.fstat(self._fd).st_size < size:  # the first worker sizes it; later ones find it so
                os.ftruncate(self._fd, size)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._map = mmap.mmap(self._fd, size)
        self._lock = threading.Lock()

    def _offset(self, cache: str, what: int) -> int | None:
        slot = self._slots.get(cache)
        return None if slot is None else (slot * _KINDS + what) * _SLOT.size

    def get(self, cache: str, what: int) -> int:
        offset = self._offset(cache, what)
        return 0 if offset is None else _SLOT.unpack_from(self._map, offset)[0]

    def bump(self, cache: str, what: int) -> None:
        offset = self._offset(cache, what)
        if offset is None:
            return
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                _SLOT.pack_into(self._map, offset, _SLOT.unpack_from(self._map, offset)[0] + 1)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
