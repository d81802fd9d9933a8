"""The node-local tier (``enable_cache(local_dir=...)``): JAX reads a private directory on the node, filled from the
shared root on demand, one policy's worth of checked files at a time.

On a local miss, JAX's lookup fetches the entry from the root, the job's ``verify`` mode judges those bytes, and a
whole entry is admitted (temporary name, then rename) before JAX gets the bytes. Each trust policy has its own
subdirectory, so files admitted unchecked never reach a job that checks. Admission and eviction run under JAX's
own LRU lock (``.lockfile``) and keep its ``-atime`` files; no remote read happens while it is held. At each start
local copies the root no longer has, or that are now judged bad, are dropped (:meth:`LocalTier.revalidate`); until
that listing has vouched for the local copies, a lookup answered locally first checks its one object in the root.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

import filelock

from jaxcache import entry, signing
from jaxcache.client.jax_internals import reads as jax_reads
from jaxcache.client.loads import LoadPolicy
from jaxcache.errors import PreconditionFailedError
from jaxcache.records import LocalTierCounts
from jaxcache.storage import LocalStorage, Storage

log = logging.getLogger("jaxcache.client")

LOCK_NAME = ".lockfile"  # JAX's LRU lock (jax._src.lru_cache): its eviction and ours never interleave
ATIME_SUFFIX = "-atime"
PENDING_DIR = os.path.join(".jaxcache", "pending")  # keys JAX wrote here whose upload has not finished
UNVERIFIED_DIR = os.path.join(".jaxcache", "unverified")  # signed directories: local writes no signature covers
FETCHING_DIR = os.path.join(".jaxcache", "fetching")  # the per-key turns of processes fetching from the root
FETCH_STRIPES = 64  # lock files, keys spread over them: bounded, however many keys the node sees
FETCH_TURN_S = 60.0  # the longest a process waits for another's download of the same stripe
LOCK_TIMEOUT_S = 10.0  # JAX's own lock timeout
TEMP_PREFIXES = (".jaxcache-tmp-", ".jaxcache-probe-")  # LocalStorage.write_atomic's, and tier_dir.open_dir's
TEMP_AGE_S = 3600.0
# The longest a lookup waits for the start's listing of the root (one request for most roots, under way since
# enable_cache) before asking the root for its one object instead: a listing of a huge bucket takes pages.
LISTING_WAIT_S = 5.0


def healed_text(healed: list[tuple[str, bool]]) -> str:
    """What :meth:`LocalTier.heal` did, in words."""
    return ", ".join(f"{key} ({'its -atime written' if kept else 'broken without its -atime: removed'})"
                     for key, kept in healed)


@dataclass(frozen=True, slots=True)
class Pulled:
    """One entry read from the root: its bytes when they passed (``admitted`` once kept locally), else why not
    (``reason``: the job's checks refused them; both None: not there, or unreadable)."""

    data: bytes | None
    reason: str | None
    admitted: bool
    here: bool = False  # found in the local directory (another process fetched it meanwhile): nothing downloaded


class Ahead(Protocol):
    """Fetches made before JAX asked (:class:`jaxcache.client.prefetch.Prefetcher`)."""

    def take(self, key: str) -> Pulled | None:
        """The fetch of ``key`` (waited for when under way), or None: none made or started."""

    def asked(self, key: str) -> None:
        """JAX asked for ``key`` and loaded it locally."""


class LocalTier:
    """JAX's cache directory on this node, kept in step with the shared root."""

    def __init__(self, directory: str, root: Callable[[], Storage], *, policy: LoadPolicy | None,
                 refused: Callable[[str, str], None], max_size_bytes: int | None) -> None:
        self.directory = directory
        self.storage = LocalStorage(directory)
        self._root = root
        self._policy = policy
        self._refused = refused
        self._max = max_size_bytes
        self._lock = filelock.FileLock(os.path.join(directory, LOCK_NAME), timeout=LOCK_TIMEOUT_S)
        self._turns = os.path.join(directory, FETCHING_DIR)
        os.makedirs(self._turns, mode=0o700, exist_ok=True)
        self._mutex = threading.Lock()
        self.counts = LocalTierCounts(directory=directory)
        self._warned: set[str] = set()
        self._undo: Callable[[], None] | None = None
        self.prefetch: Ahead | None = None  # the working set's fetches, when the session starts them
        # Set once the start's listing of the root has dropped every local copy the root lacks; until then a local
        # copy is loaded only once its object is found in the root (the first job after a prune, too).
        self.vouched = threading.Event()
        self.listed = threading.Event()  # the start's listing ended, vouching or not

    # -- counts ---------------------------------------------------------------------------------------------

    def add(self, **deltas: float) -> None:
        """Add to the counts (thread-safe)."""
        with self._mutex:
            for name, delta in deltas.items():
                setattr(self.counts, name, getattr(self.counts, name) + delta)

    def snapshot(self) -> LocalTierCounts:
        """The counts as of now."""
        with self._mutex:
            return LocalTierCounts(**{f: getattr(self.counts, f) for f in self.counts.__struct_fields__})

    def warn_once(self, what: str, text: str, *args: Any) -> None:
        """Say ``text`` at WARNING the first time ``what`` happens in this process."""
        with self._mutex:
            first = what not in self._warned
            self._warned.add(what)
        if first:
            log.warning(text, *args)

    # -- JAX's reads ----------------------------------------------------------------------------------------

    def install(self) -> None:
        """Answer JAX's lookups: the local file, else the root's entry, checked and admitted."""
        self._undo = jax_reads.hook_cache_gets(self._get)
        if self._undo is None:
            self.warn_once("hook", "jaxcache: this JAX has no compilation_cache._get_cache: the node-local tier at %s"
                           " fetches nothing on demand; JAX finds there only what it wrote", self.directory)

    def uninstall(self) -> None:
        """Stop answering lookups (tests)."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def _get(self, local_get: Callable[[str], bytes | None], key: str) -> bytes | None:
        value = local_get(key)
        if value is None and self.prefetch is not None:
            ahead = self.prefetch.take(key)  # fetched (or under way) before JAX asked: wait for it, not twice
            if ahead is not None and ahead.reason is not None:
                self._refuse(key, ahead.reason)
                return None
            if ahead is not None and ahead.admitted:
                value = local_get(key)
        elif value is not None and not self._in_root(key):
            return None  # gone from the root since this copy came: dropped, and JAX compiles the program
        if value is not None:
            self.add(loaded=1, loaded_bytes=len(value))
            if self.prefetch is not None:
                self.prefetch.asked(key)
            return value
        return self.fetch(key)

    def _in_root(self, key: str) -> bool:
        """Whether a local copy may be loaded: the start's listing vouched for it, JAX wrote it here and its upload
        is pending, or the root holds its object (one stat); a copy the root lacks is dropped."""
        if self.vouched.is_set() or os.path.exists(os.path.join(self.directory, PENDING_DIR, key)):
            return True
        if self.listed.wait(LISTING_WAIT_S) and self.vouched.is_set():
            # The listing dropped what the root lacks: a copy still here is vouched for.
            return os.path.exists(os.path.join(self.directory, entry.cache_name(key)))
        try:
            there = self._root().stat(entry.cache_name(key)) is not None
        except Exception as exc:  # noqa: BLE001 - as when the listing fails: the copies stay, the job goes on
            self.warn_once("stat", "jaxcache: could not ask the shared root for %s (%s); loading the local copy",
                           key, exc)
            return True
        if not there:
            with self._lock:
                if self.remove(key):
                    self.add(dropped=1)
            self.warn_once("gone", "jaxcache: the shared root no longer has %s; its local copy is dropped and JAX"
                           " compiles the program", key)
        return there

    def fetch(self, key: str) -> bytes | None:
        """The root's entry for ``key`` when it passes the job's checks, admitted locally first; else None (JAX
        compiles). Never raises: a root that cannot be read is a miss, as it is for JAX reading it directly."""
        started = time.monotonic()
        pulled = self.pull(key)
        if pulled.reason is not None:
            self._refuse(key, pulled.reason)
            return None
        if pulled.here and pulled.data is not None:
            self.add(loaded=1, loaded_bytes=len(pulled.data))
        elif pulled.data is not None:
            self.add(fetched=1, fetched_bytes=len(pulled.data), fetched_s=time.monotonic() - started)
        return pulled.data

    def pull(self, key: str) -> Pulled:
        """Read ``key``'s entry from the root, judge it and admit it; counts nothing (on demand, or ahead of JAX).
        Processes on the node take turns per key (a lock of :data:`FETCH_STRIPES`): one that finds the entry here
        once its turn comes answers it as ``here`` instead of downloading it again."""
        stripe = filelock.FileLock(os.path.join(self._turns, str(int(key[-4:], 16) % FETCH_STRIPES)),
                                   timeout=FETCH_TURN_S)
        try:
            with stripe:
                return self._pull(key)
        except filelock.Timeout:  # another process's download is slow: fetch for this one rather than wait on
            return self._pull(key)

    def _pull(self, key: str) -> Pulled:
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(self.directory, entry.cache_name(key)), "rb") as f:
                return Pulled(f.read(), None, True, here=True)  # whole: admitted files appear by rename
        try:
            data = self._root().read(entry.cache_name(key))
        except Exception as exc:  # noqa: BLE001 - a lookup must never fail a compile
            self.warn_once("fetch", "jaxcache: could not fetch %s from the shared root (%s); JAX compiles what it"
                           " cannot fetch", key, exc)
            return Pulled(None, None, False)
        if data is None:
            return Pulled(None, None, False)
        reason = self._judge(key, data)
        if reason is not None:
            return Pulled(None, reason, False)
        try:
            self.admit(key, data)
        except Exception as exc:  # noqa: BLE001 - the bytes passed: JAX loads them even when the disk cannot keep them
            self.warn_once("admit", "jaxcache: could not keep %s in the node-local tier %s (%s); JAX loads it"
                           " anyway", key, self.directory, exc)
            return Pulled(data, None, False)
        return Pulled(data, None, True)

    def _refuse(self, key: str, reason: str) -> None:
        self.add(skipped=1)
        with contextlib.suppress(Exception):
            self._refused(key, reason)

    def _judge(self, key: str, data: bytes) -> str | None:
        if self._policy is not None:
            try:
                reason = self._policy.judge(key, data)
            except Exception as exc:  # noqa: BLE001 - fail closed: a judge that cannot decide lets nothing in
                reason = f"{jax_reads.JUDGE_FAILED}: {type(exc).__name__}: {exc}"
            if reason is not None:
                return reason
        whole = entry.validate(data)  # a broken entry never enters: JAX would fail on it at every lookup
        if whole.status is not entry.Status.OK:
            self.warn_once("broken", "jaxcache: the shared root's entry for %s is broken (%s); not admitting it,"
                           " JAX compiles it", key, whole.reason)
            return f"{whole.status}"
        return None

    # -- the directory, under JAX's lock --------------------------------------------------------------------

    def admit(self, key: str, data: bytes) -> bool:
        """Put a checked entry in place whole, as JAX's LRU would (its atime first, then the entry, by rename).
        False when the key was there already (JAX's files are never replaced by ours)."""
        name = entry.cache_name(key)
        with self._lock:
            if os.path.exists(os.path.join(self.directory, name)):
                return False
            self._evict(len(data))
            self._touch(key)
            try:
                self.storage.write_atomic(name, data, create_only=True)
            except PreconditionFailedError:
                return False
        return True

    def _touch(self, key: str) -> None:
        # JAX 0.10's eviction fails on an entry without its atime file: it is written before the entry appears.
        with open(os.path.join(self.directory, key + ATIME_SUFFIX), "wb") as f:
            f.write(time.time_ns().to_bytes(8, "little"))

    def _evict(self, additional: int) -> None:
        """JAX's LRU eviction (``_evict_if_needed``), where it would not run: least recently used first. Never an
        entry whose upload is pending: this node may be the only place it is (it counts towards the cap, though)."""
        if self._max is None:
            return
        try:
            pinned = set(os.listdir(os.path.join(self.directory, PENDING_DIR)))
        except FileNotFoundError:
            pinned = set()
        found: list[tuple[int, str, int]] = []
        total = 0
        with os.scandir(self.directory) as it:
            for de in it:
                if not de.name.endswith("-cache") or not de.is_file(follow_symlinks=False):
                    continue
                key = de.name.removesuffix("-cache")
                try:
                    size = de.stat(follow_symlinks=False).st_size
                    with open(os.path.join(self.directory, key + ATIME_SUFFIX), "rb") as f:
                        atime = int.from_bytes(f.read(8), "little")
                except FileNotFoundError:
                    atime = 0  # an entry whose atime was never written counts as the least recently used
                total += size
                if key not in pinned:
                    found.append((atime, key, size))
        found.sort()
        for _atime, key, size in found:
            if total <= self._max - additional:
                break
            self.remove(key)
            total -= size
            self.add(evicted=1)

    def lock(self) -> filelock.FileLock:
        """JAX's LRU lock over this directory."""
        return self._lock

    def remove(self, key: str) -> bool:
        """Remove a key's entry and atime files; hold :meth:`lock`. False when the entry was gone already."""
        removed = False
        for name in (entry.cache_name(key), key + ATIME_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, name))
                removed = removed or name.endswith("-cache")
        return removed

    def heal(self) -> list[tuple[str, bool]]:
        """Entries without their ``-atime`` file (a disk that filled up, or a kill, between JAX's two writes): JAX
        0.10's eviction reads every ``-atime``, so one such entry fails every later write here. Under JAX's lock,
        where no write of JAX's is half done, an entry that decompresses whole gets its ``-atime``, one that does
        not is removed. Returns each key healed, with whether its entry was kept."""
        names = set(os.listdir(self.directory))
        if not [n for n in names if n.endswith("-cache") and n.removesuffix("-cache") + ATIME_SUFFIX not in names]:
            return []  # the usual start: no lock taken
        healed: list[tuple[str, bool]] = []
        with self._lock:
            names = set(os.listdir(self.directory))
            for name in sorted(names):
                key = name.removesuffix("-cache")
                if not name.endswith("-cache") or key + ATIME_SUFFIX in names:
                    continue
                chunks = self.storage.read_chunks(name)
                if chunks is None:
                    continue
                whole = entry.validate_chunks(chunks).status is entry.Status.OK
                if whole:
                    self._touch(key)
                else:
                    self.remove(key)
                healed.append((key, whole))
        if healed:
            self.add(healed=len(healed))
            log.warning("jaxcache: healed %s: %s", self.directory, healed_text(healed))
        return healed

    def _sweep(self, names: list[str]) -> None:
        """Remove temporary files a process killed mid-admission left behind (never read by JAX, but never evicted
        either); one younger than :data:`TEMP_AGE_S` may be another process's admission under way."""
        for name in names:
            path = os.path.join(self.directory, name)
            with contextlib.suppress(FileNotFoundError):
                if time.time() - os.stat(path).st_mtime > TEMP_AGE_S:
                    os.unlink(path)

    def revalidate(self, bad: Collection[str], *, need_signature: bool, pending: Callable[[], Collection[str]],
                   unverified: Collection[str] = (), list_root: bool = True) -> list[str]:
        """See :meth:`_revalidate`; with ``list_root``, :attr:`listed` is set once it ends, however it ends."""
        try:
            return self._revalidate(bad, need_signature=need_signature, pending=pending, unverified=unverified,
                                    list_root=list_root)
        finally:
            if list_root:
                self.listed.set()

    def _revalidate(self, bad: Collection[str], *, need_signature: bool, pending: Callable[[], Collection[str]],
                    unverified: Collection[str], list_root: bool) -> list[str]:
        """Drop local copies that are in ``bad``, or (``need_signature``) were written here ``unverified``, and
        (``list_root``) of keys the root no longer has or (``need_signature``) whose signature left it, keeping
        those JAX wrote here whose upload is still ``pending``. One listing of the root, made before taking the
        lock. Returns the keys dropped."""
        names = os.listdir(self.directory)
        if list_root:
            self._sweep([n for n in names if n.startswith(TEMP_PREFIXES)])
        # In this order: a key another process is writing is marked pending before its entry appears, and
        # unmarked only once the root has it, so a key listed here is either pending now or in the root below.
        waiting = set(pending())
        local = [k for n in names if n.endswith("-cache") and (k := n.removesuffix("-cache")) not in waiting]
        if not local:
            if list_root:
                self.vouched.set()  # nothing here the root could lack (JAX's own writes are pending)
            return []
        listed: set[str] | None = None
        try:
            if list_root:
                listed = {name for name, *_ in self._root().list_stats(("-cache", signing.SIG_SUFFIX))}
        except Exception as exc:  # noqa: BLE001 - an unreachable root must not stop the job: JAX compiles what it lacks
            log.warning("jaxcache: could not list the shared root to revalidate %s (%s); only copies known bad are"
                        " dropped this time", self.directory, exc)
        drop = [k for k in local if k in bad or (need_signature and k in unverified) or (listed is not None and (
            entry.cache_name(k) not in listed or (need_signature and signing.sig_name(k) not in listed)))]
        if drop:
            with self._lock:  # counting only what is still here: the uploader may have removed a torn write meanwhile
                drop = [key for key in drop if self.remove(key)]
        if drop:
            self.add(dropped=len(drop))
            log.info("jaxcache: dropped %d local copies from %s that the shared root no longer has or that are"
                     " judged bad", len(drop), self.directory)
        if listed is not None:
            self.vouched.set()
        return drop
