"""The node-local tier (``enable_cache(local_dir=...)``): JAX reads a private directory on the node, filled from the
shared root on demand, one policy's worth of checked files at a time.

On a local miss, JAX's lookup fetches the entry from the root, the job's ``verify`` mode judges those bytes, and a
whole entry is admitted (temporary name, then rename) before JAX gets the bytes. Each trust policy has its own
subdirectory, so files admitted unchecked never reach a job that checks. Admission and eviction run under JAX's
own LRU lock (``.lockfile``) and keep its ``-atime`` files; no remote read happens while it is held. Each copy keeps
its origin (:mod:`jaxcache.client.origins`) and loads once checked against the root in this process
(:mod:`jaxcache.client.copy_checks`), or while a write of this node's waits for its upload. Copies judged bad (and,
``verify="attested"``, those whose bytes are not the digest the service attests) are dropped at start. Every request
to the root is bounded (:mod:`jaxcache.client.root_calls`): a lookup the root does not answer in time is a miss.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import filelock

from jaxcache import entry, signing
from jaxcache.client.copy_checks import LOAD, UNANSWERED, CopyChecks, PackVouch
from jaxcache.client.jax_dir import ATIME_SUFFIX, JaxDir
from jaxcache.client.jax_internals import reads as jax_reads
from jaxcache.client.loads import LoadPolicy
from jaxcache.client.origins import Origin, Origins, stat_of
from jaxcache.client.root_calls import RootCalls
from jaxcache.errors import NotRegularFileError, PreconditionFailedError, UnreachableError
from jaxcache.records import LocalTierCounts
from jaxcache.storage import Storage
from jaxcache.storage.base import ObjectInfo, Stat

log = logging.getLogger("jaxcache.client")

PENDING_DIR = os.path.join(".jaxcache", "pending")  # keys JAX wrote here whose upload has not finished
UNVERIFIED_DIR = os.path.join(".jaxcache", "unverified")  # signed directories: local writes no signature covers
FETCHING_DIR = os.path.join(".jaxcache", "fetching")  # the per-key turns of processes fetching from the root
FETCH_STRIPES = 64  # lock files, keys spread over them: bounded, however many keys the node sees
FETCH_TURN_S = 60.0  # the longest a process waits for another's download of the same stripe
# A pack's entries admitted under one hold of JAX's lock (and one eviction's listing): JAX's own writes wait for it.
ADMIT_BATCH = 256
ADMIT_BATCH_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Pulled:
    """One entry read from the root: its bytes when they passed (``admitted`` once kept locally), else why not
    (``reason``: the job's checks refused them; both None: not there, or unreadable)."""

    data: bytes | None
    reason: str | None
    admitted: bool
    here: bool = False  # found in the local directory (another process fetched it meanwhile): nothing downloaded
    unanswered: bool = False  # the root did not answer in time: JAX compiles, and nothing asks the root again now


class Ahead(Protocol):
    """Fetches made before JAX asked (:class:`jaxcache.client.prefetch.Prefetcher`)."""

    def take(self, key: str, until: float) -> Pulled | None:
        """The fetch of ``key`` (waited for when under way, until ``until``: ``time.monotonic()``), or None: none
        made or started."""

    def asked(self, key: str) -> None:
        """JAX asked for ``key`` and loaded it locally."""


class LocalTier(JaxDir):
    """JAX's cache directory on this node, kept in step with the shared root."""

    def __init__(self, directory: str, root: RootCalls | Callable[[], Storage], *, policy: LoadPolicy | None,
                 refused: Callable[[str, str], None], max_size_bytes: int | None) -> None:
        super().__init__(directory, max_size_bytes=max_size_bytes)
        # Every request to the root goes through it: bounded in time (a bare opener gets the default deadline).
        self.calls = root if isinstance(root, RootCalls) else RootCalls(root)
        self._policy = policy
        self._refused = refused
        self._turns = os.path.join(directory, FETCHING_DIR)
        os.makedirs(self._turns, mode=0o700, exist_ok=True)
        self.origins = Origins(directory)
        self.counts = LocalTierCounts(directory=directory)
        self.prefetch: Ahead | None = None  # the working set's fetches (or the named pack's), as the session starts
        self.pack: PackVouch | None = None  # the job's named pack, which vouches for the copies it seeded
        # What loads is what this process checked against the root (or wrote): verify="signed" checks the -sig too.
        self.signed = policy is not None and policy.mode == "signed"
        self.checks = CopyChecks(self)
        # Signed: the root's -sig objects as the start's listing saw them (a small root's), the origin of what is
        # admitted after it; a copy admitted without one has its signature read again at its first check.
        self.sigs: dict[str, Stat] = {}

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
        until = self.calls.until()  # this lookup's deadline for all the root's answers it waits for
        value, unanswered = self._local(key, until)
        if unanswered:
            return None  # a copy not checked, or a root not answering: JAX compiles
        if value is None and self.prefetch is not None:
            ahead = self.prefetch.take(key, until)  # fetched (or under way) before JAX asked: wait for it, not twice
            if ahead is not None and ahead.unanswered:
                return None
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
        return self.fetch(key, until)

    def _local(self, key: str, until: float) -> tuple[bytes | None, bool]:
        """The local copy of ``key`` if it may be loaded: JAX wrote it here and its upload is pending, or this
        process found its object in the root to be the one it came from (:class:`CopyChecks`); a copy found gone
        or replaced is dropped (JAX's lookup then fetches the root's entry, or compiles when there is none). With
        it, True where a copy was here that could not be checked (the root did not answer): it is removed, and JAX
        compiles without asking the root again."""
        if not os.path.lexists(os.path.join(self.directory, entry.cache_name(key))):
            return None, False
        if os.path.exists(os.path.join(self.directory, PENDING_DIR, key)):
            return self.read(key), False
        verdict = self.checks.check(key, until)
        if verdict == LOAD:
            return self.read(key), False
        if verdict == UNANSWERED:
            # JAX compiles the program and puts its own entry here (it never writes over a file): what the node keeps
            # is then that write, waiting for its upload (and loaded by the node's next jobs meanwhile).
            with self._lock:
                self.remove(key)
            return None, True
        return None, False

    def fetch(self, key: str, until: float | None = None) -> bytes | None:
        """The root's entry for ``key`` when it passes the job's checks, admitted locally first; else None (JAX
        compiles). Never raises: a root that cannot be read (or not by ``until``) is a miss, as it is for JAX reading
        it directly."""
        started = time.monotonic()
        pulled = self.pull(key, until)
        if pulled.reason is not None:
            self._refuse(key, pulled.reason)
            return None
        if pulled.here and pulled.data is not None:
            self.add(loaded=1, loaded_bytes=len(pulled.data))
        elif pulled.data is not None:
            self.add(fetched=1, fetched_bytes=len(pulled.data), fetched_s=time.monotonic() - started)
        return pulled.data

    def pull(self, key: str, until: float | None = None) -> Pulled:
        """Read ``key``'s entry from the root, judge it and admit it; counts nothing (on demand, or ahead of JAX).
        The root's answers are waited for until ``until`` (``time.monotonic()``; default: a deadline from now).
        Processes on the node take turns per key (a lock of :data:`FETCH_STRIPES`): one that finds the entry here
        once its turn comes answers it as ``here`` instead of downloading it again."""
        wait_s = FETCH_TURN_S if until is None else max(0.0, min(FETCH_TURN_S, until - time.monotonic()))
        stripe = filelock.FileLock(os.path.join(self._turns, str(int(key[-4:], 16) % FETCH_STRIPES)), timeout=wait_s)
        try:
            with stripe:
                return self._pull(key, until)
        except filelock.Timeout:  # another process's download is slow: fetch for this one rather than wait on
            if until is not None and time.monotonic() >= until:
                return Pulled(None, None, False, unanswered=True)
            return self._pull(key, until)

    def _pull(self, key: str, until: float | None) -> Pulled:
        name = entry.cache_name(key)
        with contextlib.suppress(NotRegularFileError):  # not a regular file: fetched, never admitted over it
            here = self.storage.read(name)
            if here is not None:
                return Pulled(here, None, True, here=True)  # whole: admitted files appear by rename
        try:
            read = self.calls.ask(lambda root: self._download(root, key), what=f"a fetch of {key}", until=until)
        except UnreachableError:
            return Pulled(None, None, False, unanswered=True)
        except Exception as exc:  # noqa: BLE001 - a lookup must never fail a compile
            self.warn_once("fetch", "jaxcache: could not fetch %s from the shared root (%s); JAX compiles what it"
                           " cannot fetch", key, exc)
            return Pulled(None, None, False)
        if read is None:
            return Pulled(None, None, False)
        data, info, reason = read
        if reason is None:
            reason = self._judge(key, data)
        if reason is not None:
            return Pulled(None, reason, False)
        try:
            # Where a policy compares copies with digests, of the bytes in memory (less than their download costs).
            digest = None if self._policy is None or self._policy.attested is None else hashlib.sha256(
                data).hexdigest()
            self.admit(key, data, Origin(stat_of(info), self.sigs.get(signing.sig_name(key)), digest))
        except Exception as exc:  # noqa: BLE001 - the bytes passed: JAX loads them even when the disk cannot keep them
            self.warn_once("admit", "jaxcache: could not keep %s in the node-local tier %s (%s); JAX loads it"
                           " anyway", key, self.directory, exc)
            return Pulled(data, None, False)
        self.checks.vouch(key)  # the root's current object: it loads in this process without another look
        return Pulled(data, None, True)

    def _download(self, root: Storage, key: str) -> tuple[bytes, ObjectInfo, str | None] | None:
        """The root's entry for ``key`` with what names its object, and (signed: the judge reads the root's
        signature object) why the job's verify mode refuses those bytes; on the deadline's thread."""
        read = root.read_with_info(entry.cache_name(key))
        if read is None:
            return None
        data, info = read
        return data, info, self.reason(key, data) if self.signed else None

    def _refuse(self, key: str, reason: str) -> None:
        self.add(skipped=1)
        with contextlib.suppress(Exception):
            self._refused(key, reason)

    def reason(self, key: str, data: bytes) -> str | None:
        """Why the job's verify mode refuses these bytes for ``key`` now, or None."""
        if self._policy is None:
            return None
        try:
            return self._policy.judge(key, data)
        except Exception as exc:  # noqa: BLE001 - fail closed: a judge that cannot decide lets nothing in
            return f"{jax_reads.JUDGE_FAILED}: {type(exc).__name__}: {exc}"

    def _judge(self, key: str, data: bytes) -> str | None:
        """Why these bytes of ``key`` are not admitted: the job's verify mode (signed: judged already, with the
        root's answers) refuses them, or they are not a whole entry."""
        reason = None if self.signed else self.reason(key, data)
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

    def admit_all(self, items: Iterable[tuple[str, bytes, Origin]], *, keep: Collection[str]) -> list[str]:
        """Put checked entries in place as :meth:`admit` does (a pack's seeding), under JAX's lock a batch at a time
        with one eviction a batch. A copy already here with the same bytes takes the new origin; one with other bytes
        (or no origin) is replaced, but never JAX's own write waiting for its upload (``keep``). Returns the keys
        whose copies are now the ``items``' bytes."""
        placed: list[str] = []
        batch: list[tuple[str, bytes, Origin]] = []
        for item in items:
            batch.append(item)
            if len(batch) >= ADMIT_BATCH or sum(len(d) for _, d, _ in batch) >= ADMIT_BATCH_BYTES:
                placed += self._admit_batch(batch, keep)
                batch = []
        return placed + self._admit_batch(batch, keep)

    def _admit_batch(self, batch: list[tuple[str, bytes, Origin]], keep: Collection[str]) -> list[str]:
        placed = []
        with self._lock:
            self._evict(sum(len(data) for _key, data, _origin in batch))
            for key, data, origin in batch:
                if key in keep:
                    continue
                name = entry.cache_name(key)
                if os.path.lexists(os.path.join(self.directory, name)):
                    try:
                        here = self.storage.read(name)
                    except NotRegularFileError:
                        here = None
                    old = self.origins.read(key)
                    if here is not None and old is not None and hashlib.sha256(here).hexdigest() == origin.sha256:
                        self.origins.write(key, Origin(old.cache, old.sig, origin.sha256, origin.pack))
                        placed.append(key)
                        continue
                    self.remove(key)
                self._touch(key)
                try:
                    self.storage.write_atomic(name, data, create_only=True)
                except PreconditionFailedError:
                    continue
                self.origins.write(key, origin)
                placed.append(key)
        return placed

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

    def drop(self, keys: Collection[str], pending: Collection[str]) -> list[str]:
        """Drop the local copies of ``keys`` (known bad at start, or written here unverified), keeping those JAX
        wrote here whose upload is still ``pending``. No request. Returns the keys dropped."""
        waiting = set(pending)
        with self._lock:  # counting only what is still here: the uploader may have removed a torn write meanwhile
            dropped = [key for key in keys if key not in waiting and self.remove(key)]
        if dropped:
            self.add(dropped=len(dropped))
            log.info("jaxcache: dropped %d local copies from %s that are judged bad", len(dropped), self.directory)
        return dropped
