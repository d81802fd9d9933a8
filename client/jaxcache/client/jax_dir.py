"""A directory JAX's cache reads and writes, kept so that nothing in it can stop a job: the node-local tier
(:mod:`jaxcache.client.local_tier`), or a directory root read without one.

JAX opens its files with plain reads and writes. A FIFO named like an entry blocks its lookup for ever; with its LRU
on (``max_size_bytes``), so does a FIFO named like an entry's ``-atime`` (written on every hit, read by the
eviction inside every write), and an entry without its ``-atime`` fails every later write of JAX 0.10 there. So the
client answers JAX's lookups itself, as JAX's ``LRUCache.get`` would (under its ``.lockfile``, touching the
``-atime``), never opening what is not a regular file in a way that could wait (a miss, with one warning), and
before each of JAX's writes with its LRU on heals what its eviction would stop on (:meth:`JaxDir.heal`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import filelock

from jaxcache import entry
from jaxcache.client.jax_internals import reads as jax_reads
from jaxcache.errors import NotRegularFileError
from jaxcache.storage import LocalStorage
from jaxcache.storage.files import kind_of, write_small

log = logging.getLogger("jaxcache.client")

LOCK_NAME = ".lockfile"  # JAX's LRU lock (jax._src.lru_cache): its eviction and ours never interleave
ATIME_SUFFIX = "-atime"
LOCK_TIMEOUT_S = 10.0  # JAX's own lock timeout

# What heal did to a key, as the warning and the summary say it.
ATIME_WRITTEN = "its -atime written"
BROKEN_REMOVED = "broken without its -atime: removed"
ODD_REMOVED = "not a regular file: removed"
ODD_ATIME_REPLACED = "its -atime not a regular file: replaced"
ODD_ATIME_REMOVED = "its -atime not a regular file and not replaceable: removed"
ODD_LEFT = "not a regular file, and it could not be removed"


def healed_text(healed: list[tuple[str, str]]) -> str:
    """What :meth:`JaxDir.heal` did, in words."""
    return ", ".join(f"{key} ({what})" for key, what in healed)


class JaxDir:
    """JAX's cache directory as the client keeps it: lookups that never wait on a file that is not a regular one,
    JAX's LRU format (``max_size_bytes``: its lock and ``-atime`` files), and healing before JAX writes."""

    def __init__(self, directory: str, *, max_size_bytes: int | None) -> None:
        self.directory = directory
        self.storage = LocalStorage(directory, must_exist=False)  # JAX makes a root's at its first lookup
        self._max = max_size_bytes  # JAX's LRU runs here (jax_compilation_cache_max_size), so the client keeps it
        self._lock = filelock.FileLock(os.path.join(directory, LOCK_NAME), timeout=LOCK_TIMEOUT_S)
        self._mutex = threading.Lock()
        self._warned: set[str] = set()
        self._undo: Callable[[], None] | None = None

    def add(self, **deltas: float) -> None:
        """Count what happened (the node-local tier keeps counts for the run record; a root keeps none)."""

    def warn_once(self, what: str, text: str, *args: Any) -> None:
        """Say ``text`` at WARNING the first time ``what`` happens in this process."""
        with self._mutex:
            first = what not in self._warned
            self._warned.add(what)
        if first:
            log.warning(text, *args)

    def lock(self) -> filelock.FileLock:
        """JAX's LRU lock over this directory."""
        return self._lock

    # -- JAX's reads ----------------------------------------------------------------------------------------

    def install(self) -> bool:
        """Answer JAX's lookups here (:meth:`_get`); False where this JAX has nothing to hook."""
        self._undo = jax_reads.hook_cache_gets(self._get)
        return self._undo is not None

    def uninstall(self) -> None:
        """Stop answering lookups (tests)."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def _get(self, _jax_get: Callable[[str], bytes | None], key: str) -> bytes | None:
        return self.read(key)

    def read(self, key: str) -> bytes | None:
        """JAX's lookup of ``key`` here, as its ``LRUCache.get`` makes it (with its LRU on: under its lock, the
        entry's ``-atime`` touched on a hit), except that nothing is opened in a way that could wait: an entry that
        is not a regular file is a miss, with one warning."""
        if self._max is None:
            return self._read(key)
        with self._lock:
            data = self._read(key)
            if data is not None and not self._touch(key):
                self._odd(key + ATIME_SUFFIX, "its entry loads; the next write here replaces it")
        return data

    def _read(self, key: str) -> bytes | None:
        name = entry.cache_name(key)
        try:
            return self.storage.read(name)
        except NotRegularFileError:
            self._odd(name, "a miss: JAX compiles the program")
            return None

    def _odd(self, name: str, then: str) -> None:
        try:
            kind = kind_of(os.lstat(os.path.join(self.directory, name)).st_mode)
        except OSError:
            kind = "not a regular file"
        self.warn_once(f"odd {name}", "jaxcache: %s in %s is %s, not a regular file: never opened (it could block"
                       " the job); %s", name, self.directory, kind, then)

    def _touch(self, key: str) -> bool:
        """Write ``key``'s ``-atime`` as JAX's LRU does (``time.time_ns()``, 8 bytes little-endian); False where its
        name is held by something other than a regular file. JAX 0.10's eviction fails on an entry without it."""
        return write_small(os.path.join(self.directory, key + ATIME_SUFFIX), time.time_ns().to_bytes(8, "little"))

    # -- the directory, under JAX's lock --------------------------------------------------------------------

    def remove(self, key: str) -> bool:
        """Remove a key's entry and atime files; hold :meth:`lock`. False when the entry was gone already (or is
        something that cannot be removed: a folder)."""
        removed = False
        for name in (entry.cache_name(key), key + ATIME_SUFFIX):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                os.unlink(os.path.join(self.directory, name))
                removed = removed or name.endswith("-cache")
        return removed

    def _broken(self) -> list[str]:
        """The keys JAX's eviction would stop on: an entry that is not a regular file, or one whose ``-atime`` is
        missing or not a regular file (one listing; the type from the directory entry)."""
        caches: dict[str, bool] = {}
        atimes: dict[str, bool] = {}
        with os.scandir(self.directory) as it:
            for de in it:
                if de.name.endswith("-cache"):
                    caches[de.name.removesuffix("-cache")] = de.is_file(follow_symlinks=False)
                elif de.name.endswith(ATIME_SUFFIX):
                    atimes[de.name.removesuffix(ATIME_SUFFIX)] = de.is_file(follow_symlinks=False)
        return sorted(k for k, regular in caches.items() if not regular or not atimes.get(k, False))

    def heal(self) -> list[tuple[str, str]]:
        """What would stop JAX's writes here, healed under JAX's lock (where no write of JAX's is half done): an
        entry without its ``-atime`` (a full disk, or a kill, between JAX's two writes) gets it when it decompresses
        whole and is removed when it does not; an ``-atime`` that is not a regular file is replaced; an entry that
        is not a regular file is removed. Only where JAX's LRU runs (``max_size_bytes``): without it JAX reads no
        ``-atime`` and evicts nothing. Returns each key healed, with what was done (:func:`healed_text`)."""
        if self._max is None or not self._broken():
            return []  # the usual case: one listing, no lock taken
        healed: list[tuple[str, str]] = []
        with self._lock:
            for key in self._broken():
                healed.append((key, self._heal(key)))
        if healed:
            self.add(healed=len(healed))
            log.warning("jaxcache: healed %s: %s", self.directory, healed_text(healed))
        return healed

    def _heal(self, key: str) -> str:
        name = entry.cache_name(key)
        try:
            chunks = self.storage.read_chunks(name)
            whole = chunks is not None and entry.validate_chunks(chunks).status is entry.Status.OK
        except NotRegularFileError:
            return ODD_REMOVED if self.remove(key) else ODD_LEFT
        if not whole:
            self.remove(key)
            return BROKEN_REMOVED
        atime = os.path.join(self.directory, key + ATIME_SUFFIX)
        odd = os.path.lexists(atime)  # there, so not a regular file (or _broken would not have listed the key)
        if odd:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                os.unlink(atime)
        if self._touch(key):
            return ODD_ATIME_REPLACED if odd else ATIME_WRITTEN
        self.remove(key)  # an -atime that cannot be replaced (a folder): JAX's eviction must not find the entry
        return ODD_ATIME_REMOVED
