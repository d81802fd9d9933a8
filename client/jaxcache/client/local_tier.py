"""The node-local tier (``enable_cache(local_dir=...)``): JAX reads a private directory on the node, filled from the
shared root on demand, one policy's worth of checked files at a time.

On a local miss, JAX's lookup fetches the entry from the root, the job's ``verify`` mode judges those bytes, and a
whole entry is admitted (temporary name, then rename) before JAX gets the bytes. Each trust policy has its own
subdirectory, so files admitted unchecked never reach a job that checks. Admission and eviction run under JAX's
own LRU lock (``.lockfile``) and keep its ``-atime`` files; no remote read happens while it is held. Each copy's
origin is kept (:mod:`jaxcache.client.origins`): the root's object it was read from, and the digest of its bytes. At
each start the copies the root no longer has, whose object there was replaced since, that are now judged bad, or
(``verify="attested"``) whose bytes are not the digest the service attests for their key
(:meth:`LocalTier.unattested`) are dropped (:meth:`LocalTier.revalidate`); until that listing has vouched for the
local copies, a lookup answered locally first checks its one object in the root.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

import filelock

from jaxcache import entry, signing
from jaxcache.client.jax_dir import ATIME_SUFFIX, JaxDir
from jaxcache.client.jax_internals import reads as jax_reads
from jaxcache.client.loads import LoadPolicy
from jaxcache.client.origins import Origin, Origins, same, stat_of
from jaxcache.errors import NotRegularFileError, PreconditionFailedError
from jaxcache.records import LocalTierCounts
from jaxcache.storage import Storage
from jaxcache.storage.base import Stat

log = logging.getLogger("jaxcache.client")

PENDING_DIR = os.path.join(".jaxcache", "pending")  # keys JAX wrote here whose upload has not finished
UNVERIFIED_DIR = os.path.join(".jaxcache", "unverified")  # signed directories: local writes no signature covers
FETCHING_DIR = os.path.join(".jaxcache", "fetching")  # the per-key turns of processes fetching from the root
FETCH_STRIPES = 64  # lock files, keys spread over them: bounded, however many keys the node sees
FETCH_TURN_S = 60.0  # the longest a process waits for another's download of the same stripe
TEMP_PREFIXES = (".jaxcache-tmp-", ".jaxcache-probe-")  # LocalStorage.write_atomic's, and tier_dir.open_dir's
TEMP_AGE_S = 3600.0
# The longest a lookup waits for the start's listing of the root (one request for most roots, under way since
# enable_cache) before asking the root for its one object instead: a listing of a huge bucket takes pages.
LISTING_WAIT_S = 5.0


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


class LocalTier(JaxDir):
    """JAX's cache directory on this node, kept in step with the shared root."""

    def __init__(self, directory: str, root: Callable[[], Storage], *, policy: LoadPolicy | None,
                 refused: Callable[[str, str], None], max_size_bytes: int | None) -> None:
        super().__init__(directory, max_size_bytes=max_size_bytes)
        self._root = root
        self._policy = policy
        self._refused = refused
        self._turns = os.path.join(directory, FETCHING_DIR)
        os.makedirs(self._turns, mode=0o700, exist_ok=True)
        self.origins = Origins(directory)
        self.counts = LocalTierCounts(directory=directory)
        self.prefetch: Ahead | None = None  # the working set's fetches, when the session starts them
        # Set once the start's listing of the root has dropped every local copy the root lacks or replaced; until
        # then a local copy is loaded only once its object in the root is found to be the one it came from (the
        # first job after a prune, too).
        self.vouched = threading.Event()
        self.listed = threading.Event()  # the start's listing ended, vouching or not
        # Signed: the root's -sig objects as the start's listing saw them, the origin of what is admitted after it.
        self._sigs: dict[str, Stat] = {}

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

    # -- JAX's reads ----------------------------------------------------------------------------------------

    def install(self) -> bool:
        """Answer JAX's lookups: the local file, else the root's entry, checked and admitted."""
        if not super().install():
            self.warn_once("hook", "jaxcache: this JAX has no compilation_cache._get_cache: the node-local tier at %s"
                           " fetches nothing on demand; JAX finds there only what it wrote", self.directory)
            return False
        return True

    def _get(self, _jax_get: Callable[[str], bytes | None], key: str) -> bytes | None:
        value = self._local(key)
        if value is None and self.prefetch is not None:
            ahead = self.prefetch.take(key)  # fetched (or under way) before JAX asked: wait for it, not twice
            if ahead is not None and ahead.reason is not None:
                self._refuse(key, ahead.reason)
                return None
            if ahead is not None and ahead.admitted:
                value = self.read(key)
        if value is not None:
            self.add(loaded=1, loaded_bytes=len(value))
            if self.prefetch is not None:
                self.prefetch.asked(key)
            return value
        return self.fetch(key)

    def _local(self, key: str) -> bytes | None:
        """The local copy of ``key`` if it may be loaded: the start's listing vouched for it, JAX wrote it here and
        its upload is pending, or the root's object (one stat) is the one it came from and (a verify mode) the
        job's judge still lets its bytes through. A copy that may not is dropped (JAX's lookup then fetches the
        root's entry, or compiles when there is none)."""
        vouched = self.vouched.is_set()  # before the read: the listing's drops came before it too
        value = self.read(key)
        if value is None or vouched or os.path.exists(os.path.join(self.directory, PENDING_DIR, key)):
            return value
        if self.listed.wait(LISTING_WAIT_S) and self.vouched.is_set():
            return self.read(key)  # the listing has dropped what the root lacks or replaced: what is here is vouched
        try:
            info = self._root().stat(entry.cache_name(key))
        except Exception as exc:  # noqa: BLE001 - as when the listing fails: the copies stay, the job goes on
            self.warn_once("stat", "jaxcache: could not ask the shared root for %s (%s); loading the local copy",
                           key, exc)
            return value
        origin = self.origins.read(key)
        if info is not None and origin is not None and same(origin.cache, stat_of(info)) and (
                self._reason(key, value) is None):
            return value
        with self._lock:
            if self.remove(key):
                self.add(dropped=1)
        if info is None:
            self.warn_once("gone", "jaxcache: the shared root no longer has %s; its local copy is dropped and JAX"
                           " compiles the program", key)
        else:
            self.warn_once("replaced", "jaxcache: the shared root's entry %s is not the one its local copy came"
                           " from (replaced since, or no longer vouched for); the copy is dropped and the root's"
                           " entry fetched", key)
        return None

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
        name = entry.cache_name(key)
        with contextlib.suppress(NotRegularFileError):  # not a regular file: fetched, never admitted over it
            here = self.storage.read(name)
            if here is not None:
                return Pulled(here, None, True, here=True)  # whole: admitted files appear by rename
        try:
            read = self._root().read_with_info(name)
        except Exception as exc:  # noqa: BLE001 - a lookup must never fail a compile
            self.warn_once("fetch", "jaxcache: could not fetch %s from the shared root (%s); JAX compiles what it"
                           " cannot fetch", key, exc)
            return Pulled(None, None, False)
        if read is None:
            return Pulled(None, None, False)
        data, info = read
        reason = self._judge(key, data)
        if reason is not None:
            return Pulled(None, reason, False)
        try:
            # Where a policy compares copies with digests, of the bytes in memory (less than their download costs).
            digest = None if self._policy is None or self._policy.attested is None else hashlib.sha256(
                data).hexdigest()
            self.admit(key, data, Origin(stat_of(info), self._sigs.get(signing.sig_name(key)), digest))
        except Exception as exc:  # noqa: BLE001 - the bytes passed: JAX loads them even when the disk cannot keep them
            self.warn_once("admit", "jaxcache: could not keep %s in the node-local tier %s (%s); JAX loads it"
                           " anyway", key, self.directory, exc)
            return Pulled(data, None, False)
        return Pulled(data, None, True)

    def _refuse(self, key: str, reason: str) -> None:
        self.add(skipped=1)
        with contextlib.suppress(Exception):
            self._refused(key, reason)

    def _reason(self, key: str, data: bytes) -> str | None:
        """Why the job's verify mode refuses these bytes for ``key`` now, or None."""
        if self._policy is None:
            return None
        try:
            return self._policy.judge(key, data)
        except Exception as exc:  # noqa: BLE001 - fail closed: a judge that cannot decide lets nothing in
            return f"{jax_reads.JUDGE_FAILED}: {type(exc).__name__}: {exc}"

    def _judge(self, key: str, data: bytes) -> str | None:
        reason = self._reason(key, data)
        if reason is not None:
            return reason
        whole = entry.validate(data)  # a broken entry never enters: JAX would fail on it at every lookup
        if whole.status is not entry.Status.OK:
            self.warn_once("broken", "jaxcache: the shared root's entry for %s is broken (%s); not admitting it,"
                           " JAX compiles it", key, whole.reason)
            return f"{whole.status}"
        return None

    # -- the directory, under JAX's lock --------------------------------------------------------------------

    def admit(self, key: str, data: bytes, origin: Origin) -> bool:
        """Put a checked entry in place whole, as JAX's LRU would (its atime first, then the entry, by rename), then
        its ``origin``. False when the key was there already (JAX's files are never replaced by ours)."""
        name = entry.cache_name(key)
        with self._lock:
            if os.path.lexists(os.path.join(self.directory, name)):
                return False
            self._evict(len(data))
            self._touch(key)
            try:
                self.storage.write_atomic(name, data, create_only=True)
            except PreconditionFailedError:
                return False
            self.origins.write(key, origin)
        return True

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
                    stamp = self.storage.read_range(key + ATIME_SUFFIX, 0, 8)
                except (FileNotFoundError, NotRegularFileError):
                    stamp = None
                # An entry whose atime was never written (or is not a file) counts as the least recently used.
                atime = 0 if stamp is None else int.from_bytes(stamp, "little")
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

    def remove(self, key: str) -> bool:
        """Remove a key's entry, atime and origin files; hold :meth:`lock`. False when the entry was gone already."""
        self.origins.forget(key)
        return super().remove(key)

    def _sweep(self, names: list[str]) -> None:
        """Remove temporary files a process killed mid-admission left behind (never read by JAX, but never evicted
        either); one younger than :data:`TEMP_AGE_S` may be another process's admission under way."""
        for name in names:
            path = os.path.join(self.directory, name)
            with contextlib.suppress(FileNotFoundError):
                if time.time() - os.stat(path).st_mtime > TEMP_AGE_S:
                    os.unlink(path)

    def unattested(self, attested: Callable[[list[str]], Mapping[str, str]], pending: Collection[str]) -> set[str]:
        """The local copies whose bytes (their digest, recorded when they were admitted or uploaded) are not the
        digest ``attested`` gives for their key now (the service's, under ``verify="attested"``), asked about all
        the copies at once. A copy whose key has no such digest is not among them, nor one JAX wrote here whose
        upload is ``pending``; one without an origin is never loaded (:meth:`_local`) and is dropped anyway."""
        waiting = set(pending)
        recorded = {key: origin.sha256 for name in os.listdir(self.directory) if name.endswith("-cache")
                    and (key := name.removesuffix("-cache")) not in waiting
                    and (origin := self.origins.read(key)) is not None}
        if not recorded:
            return set()
        differ = {key for key, sha in attested(sorted(recorded)).items() if key in recorded and recorded[key] != sha}
        if differ:
            log.warning("jaxcache: verify='attested': %d local copies in %s are not the bytes the service attests"
                        " for their keys (%s); they are dropped and JAX fetches the root's entries (or compiles)",
                        len(differ), self.directory, ", ".join(sorted(differ)[:5]) + (", ..." if len(differ) > 5
                                                                                     else ""))
        return differ

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
        (``list_root``) of keys the root no longer has, whose object there is not the one the copy came from, or
        (``need_signature``) whose signature left it or no longer names the copy's bytes, keeping those JAX wrote
        here whose upload is still ``pending``. One listing of the root, made before taking the lock (and, signed,
        one read of each signature object changed since its copy was admitted). Returns the keys dropped."""
        names = os.listdir(self.directory)
        if list_root:
            self._sweep([n for n in names if n.startswith(TEMP_PREFIXES)])
        # In this order: a key another process is writing is marked pending before its entry appears, and
        # unmarked only once the root has it, so a key listed here is either pending now or in the root below.
        waiting = set(pending())
        local = [k for n in names if n.endswith("-cache") and (k := n.removesuffix("-cache")) not in waiting]
        if list_root:
            present = set(local) | waiting
            for key in self.origins.keys():  # an origin whose copy went (JAX's own eviction leaves it)
                if key not in present and not os.path.lexists(os.path.join(self.directory, entry.cache_name(key))):
                    self.origins.forget(key)
        if not local:
            if list_root:
                self.vouched.set()  # nothing here the root could lack (JAX's own writes are pending)
            return []
        listed: dict[str, Stat] | None = None
        try:
            if list_root:
                listed = {name: (size, mtime, version) for name, size, mtime, version
                          in self._root().list_stats(("-cache", signing.SIG_SUFFIX))}
        except Exception as exc:  # noqa: BLE001 - an unreachable root must not stop the job: JAX compiles what it lacks
            log.warning("jaxcache: could not list the shared root to revalidate %s (%s); only copies known bad are"
                        " dropped this time", self.directory, exc)
        drop = [k for k in local if k in bad or (need_signature and k in unverified) or (listed is not None and (
            entry.cache_name(k) not in listed or (need_signature and signing.sig_name(k) not in listed)))]
        if listed is not None:
            if need_signature:
                self._sigs = {name: stat for name, stat in listed.items() if name.endswith(signing.SIG_SUFFIX)}
            drop += self._replaced([k for k in local if k not in drop], listed, need_signature)
        if drop:
            with self._lock:  # counting only what is still here: the uploader may have removed a torn write meanwhile
                drop = [key for key in drop if self.remove(key)]
        if drop:
            self.add(dropped=len(drop))
            log.info("jaxcache: dropped %d local copies from %s that the shared root no longer has, holds another"
                     " object for, or that are judged bad", len(drop), self.directory)
        if listed is not None:
            self.vouched.set()
        return drop

    def _replaced(self, keys: list[str], listed: dict[str, Stat], need_signature: bool) -> list[str]:
        """Of ``keys`` (copies whose objects the root lists), those to drop: the root's entry is not the object the
        copy came from (or nothing says which it came from), or (``need_signature``) its signature object changed
        since and no longer covers the copy's bytes. A copy whose signature still covers it has that signature
        object recorded as its origin from now on."""
        drop = []
        for key in keys:
            origin = self.origins.read(key)
            if origin is None or not same(origin.cache, listed[entry.cache_name(key)]):
                drop.append(key)
                continue
            sig = listed[signing.sig_name(key)] if need_signature else None
            if sig is None or same(origin.sig, sig):
                continue
            try:
                data = self.storage.read(entry.cache_name(key))
            except NotRegularFileError:
                data = None
            if data is None or self._reason(key, data) is not None:
                drop.append(key)
            else:
                self.origins.write(key, Origin(origin.cache, sig, origin.sha256))
        return drop
