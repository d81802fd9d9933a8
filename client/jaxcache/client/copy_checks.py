"""Whether a copy in the node-local tier may load: checked against the shared root in this process, one at a time.

A copy loads once this process found the root's object it came from (its origin) still the root's current one (a
stat of ``<key>-cache``; ``verify="signed"``: of its ``-sig`` too, read again where it changed), or once this process
admitted or uploaded it. One gone, replaced or no longer signed is dropped; one the root did not answer about loads
nothing (JAX compiles). Requests grow with the copies a job uses, never with the root: a lookup's copy is checked
when JAX asks (joining a check under way), the working set's at start in parallel, a root of one listing page all at
once (:func:`jaxcache.storage.small_listing.small_listing`), and copies no job asks for in the background, each at
most once a day (its origin file's mtime says when it last was), so those the root no longer has leave the disk.
A copy seeded from the job's named pack loads while that pack is unchanged (:mod:`jaxcache.client.pack_seed`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Final, Literal, Protocol, TypeVar

import filelock

from jaxcache import entry, signing
from jaxcache.client.origins import Origin, Origins, same, stat_of
from jaxcache.client.root_calls import RootCalls
from jaxcache.client.workers import DaemonPool
from jaxcache.errors import NotRegularFileError, UnreachableError
from jaxcache.storage import LocalStorage, Storage
from jaxcache.storage.base import Stat
from jaxcache.storage.small_listing import small_listing

T = TypeVar("T")

Verdict = Literal["load", "dropped", "absent", "unanswered"]
LOAD: Final = "load"  # the root's current object: loads
DROPPED: Final = "dropped"  # gone from the root, replaced, no longer signed, or without an origin: removed
ABSENT: Final = "absent"  # no copy here
UNANSWERED: Final = "unanswered"  # the root did not answer (or not usefully): not loaded

#: A copy no job asks for is checked again once its last check is this old.
CHECK_EVERY_S = 86400.0
#: Checks of such copies at once: background work beside the job, which the root should hardly notice.
SWEEP_WORKERS = 2
TEMP_PREFIXES = (".jaxcache-tmp-", ".jaxcache-probe-")  # LocalStorage.write_atomic's, and tier_dir.open_dir's
TEMP_AGE_S = 3600.0
#: In the tier's directory: a file whose modification time is when a start's listing last found the root over one
#: request's worth. For :data:`CHECK_EVERY_S` after it, starts skip that listing (it would only say the same, on the
#: first lookup's path) and each copy is checked when JAX asks for it.
OVER_A_PAGE = os.path.join(".jaxcache", "root-over-a-page")


class PackVouch(Protocol):
    """The job's named pack as its start finds it (:class:`jaxcache.client.pack_seed.PackSeeder`), which vouches
    for the copies it seeded while it is still that object: they load without a request of their own."""

    def settle(self, key: str, until: float | None) -> bool:
        """Wait (within ``until``) for what the start does about ``key``: its look at the pack and, where the pack
        brings the key, its seeding; False when it did not end in time."""


class Tier(Protocol):
    """What the checks use of the tier (:class:`jaxcache.client.local_tier.LocalTier`)."""

    directory: str
    storage: LocalStorage
    origins: Origins
    calls: RootCalls
    signed: bool
    sigs: dict[str, Stat]
    pack: PackVouch | None

    def lock(self) -> filelock.FileLock: ...

    def remove(self, key: str) -> bool: ...

    def add(self, **deltas: float) -> None: ...

    def warn_once(self, what: str, text: str, *args: Any) -> None: ...

    def reason(self, key: str, data: bytes) -> str | None: ...


class CopyChecks:
    """The checks of one process's tier: each key's at most once at a time, its verdict kept. Thread-safe."""

    def __init__(self, tier: Tier) -> None:
        self._tier = tier
        self._signed = tier.signed
        self._lock = threading.Lock()
        self._vouched: set[str] = set()
        self._under_way: dict[str, Future[Verdict]] = {}
        #: Clear while the start's listing is to come or under way (:meth:`note_copies`, :meth:`list_small`).
        self.listed = threading.Event()
        self.listed.set()
        # The copies here at start, which the start's listing and the sweep check: what this process wrote or
        # admitted since is the root's object, or JAX's own write the root kept another's for (dropped next start).
        self.copies: frozenset[str] = frozenset()
        self._listing = False  # whether this start lists the root (copies here, the root not known to be large)

    def note_copies(self) -> None:
        """Take the copies here now as the ones the start's work is about (before JAX reads or writes here); where
        there are some and the root may be small, checks wait for :meth:`list_small` (within their deadline) from
        now on."""
        self.copies = frozenset(n.removesuffix("-cache") for n in os.listdir(self._tier.directory)
                                if n.endswith("-cache"))
        self._listing = bool(self.copies) and not self._known_large()
        if self._listing:
            self.listed.clear()

    def _known_large(self) -> bool:
        try:
            found = os.stat(os.path.join(self._tier.directory, OVER_A_PAGE), follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(found.st_mode) and 0 <= time.time() - found.st_mtime < CHECK_EVERY_S

    def _note_large(self, large: bool) -> None:
        """Remember (or forget) that the root is over one listing request's worth, for the next starts."""
        path = os.path.join(self._tier.directory, OVER_A_PAGE)
        if not large:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return
        try:  # never through a link, never waiting on a FIFO planted there: then the next start lists again
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError:
            return
        try:
            os.utime(fd)
        finally:
            os.close(fd)

    def vouch(self, key: str) -> None:
        """``key``'s copy is the root's current object: admitted from it or uploaded to it by this process."""
        with self._lock:
            self._vouched.add(key)

    def check(self, key: str, until: float | None = None) -> Verdict:
        """Whether ``key``'s copy may load (see the module): :data:`LOAD` once this process found it current, else
        after one check (waited for when another thread's is under way), the root's answers waited for until
        ``until`` (``time.monotonic()``; default: a deadline from now)."""
        with self._lock:
            if key in self._vouched:
                return LOAD
            future = self._under_way.get(key)
            mine = future is None
            if future is None:
                future = self._under_way[key] = Future()
        if not mine:
            left = None if until is None else max(0.0, until - time.monotonic())
            try:
                return future.result(timeout=left)
            except FutureTimeout:
                return UNANSWERED
        verdict: Verdict = UNANSWERED
        try:
            verdict = self._check(key, until)
        finally:
            with self._lock:
                del self._under_way[key]
                if verdict == LOAD:
                    self._vouched.add(key)
            future.set_result(verdict)
        return verdict

    def _check(self, key: str, until: float | None) -> Verdict:
        tier = self._tier
        calls = tier.calls
        if not self.listed.is_set():  # the start's listing, under way, may vouch for every copy in one request
            self.listed.wait(calls.deadline_s if until is None else max(0.0, until - time.monotonic()))
            with self._lock:
                if key in self._vouched:
                    return LOAD
        if not os.path.lexists(os.path.join(tier.directory, entry.cache_name(key))):
            return ABSENT
        origin = tier.origins.read(key)
        if origin is not None and origin.pack is not None and tier.pack is not None:
            # A pack's copy: the job's pack vouches for it (this process vouched for it when its start found the
            # pack unchanged, or seeded it) once the start has looked at the pack; where that takes longer than
            # half the lookup's time, the copy is checked on its own within the rest.
            if tier.pack.settle(key, until):
                with self._lock:
                    if key in self._vouched:
                        return LOAD
            origin = tier.origins.read(key)  # the seeding may have put another copy here meanwhile
        if origin is None:
            return self._drop(key, "origin")
        if origin.cache is None:
            return self._check_bytes(key, origin, until)
        looked = self._ask(key, lambda root: self._look(root, key), until)
        if looked is None:
            return UNANSWERED
        cache, sig = looked
        return self._judge(key, origin, cache, sig, until)

    def _ask(self, key: str, call: Callable[[Storage], T], until: float | None) -> T | None:
        """The root's answer for ``key``'s copy, or None where it gave none in time or failed (said once): the
        copy is then never loaded unchecked, and JAX compiles."""
        try:
            return self._tier.calls.ask(call, what=f"a check of {key}", until=until)
        except UnreachableError:
            return None
        except Exception as exc:  # noqa: BLE001 - never loaded unchecked: compiled
            self._tier.warn_once("stat", "jaxcache: could not ask the shared root for %s (%s); JAX compiles it"
                                 " rather than load a copy it could not check", key, exc)
            return None

    def _check_bytes(self, key: str, origin: Origin, until: float | None) -> Verdict:
        """A pack's copy that no pack vouches for (the job names none, or its pack was replaced or removed): checked
        against the root's entry by its bytes (one read), since nothing else of the root's object was seen when the
        copy was seeded; the same bytes make it a copy of that object from then on, checked as any other."""
        found = self._ask(key, lambda root: self._read(root, key), until)
        if found is None:
            return UNANSWERED
        cache, digest, sig = found
        if cache is None:
            return self._drop(key, "gone")
        if digest != origin.sha256:
            return self._drop(key, "replaced")
        origin = Origin(cache, origin.sig, origin.sha256, origin.pack)
        self._tier.origins.write(key, origin)
        return self._judge(key, origin, cache, sig, until)

    def _read(self, root: Storage, key: str) -> tuple[Stat | None, str | None, Stat | None]:
        try:
            found = root.read_with_info(entry.cache_name(key))
        except NotRegularFileError:
            found = None
        if found is None:
            return None, None, None
        data, info = found
        sig = root.stat(signing.sig_name(key)) if self._signed else None
        return stat_of(info), hashlib.sha256(data).hexdigest(), (None if sig is None else stat_of(sig))

    def _look(self, root: Storage, key: str) -> tuple[Stat | None, Stat | None]:
        info = root.stat(entry.cache_name(key))
        sig = root.stat(signing.sig_name(key)) if self._signed and info is not None else None
        return (None if info is None else stat_of(info)), (None if sig is None else stat_of(sig))

    def _judge(self, key: str, origin: Origin, cache: Stat | None, sig: Stat | None, until: float | None) -> Verdict:
        """The verdict on ``key``'s copy given the root's ``-cache`` (and, signed, ``-sig``) objects as seen now."""
        tier = self._tier
        if cache is None:
            return self._drop(key, "gone")
        if not same(origin.cache, cache):
            return self._drop(key, "replaced")
        if self._signed:
            if sig is None:
                return self._drop(key, "unsigned")
            if not same(origin.sig, sig):  # signed again since it vouched for the copy: does it cover these bytes?
                try:
                    data = tier.storage.read(entry.cache_name(key))
                except NotRegularFileError:
                    data = None
                if data is None:
                    return ABSENT
                try:
                    reason = tier.calls.ask(lambda _root: tier.reason(key, data), what=f"the signature of {key}",
                                            until=until)
                except UnreachableError:
                    return UNANSWERED
                if reason is not None:
                    return self._drop(key, "unsigned")
                tier.origins.write(key, Origin(origin.cache, sig, origin.sha256, origin.pack))
                return LOAD
        tier.origins.checked(key)
        return LOAD

    def _drop(self, key: str, why: str) -> Verdict:
        tier = self._tier
        with tier.lock():
            removed = tier.remove(key)
        if not removed:
            return ABSENT
        tier.add(dropped=1)
        if why == "gone":
            tier.warn_once("gone", "jaxcache: the shared root no longer has %s; its local copy is dropped and JAX"
                           " compiles the program", key)
        elif why == "unsigned":
            tier.warn_once("unsigned", "jaxcache: no trusted signature in the shared root covers the local copy of"
                           " %s any more; the copy is dropped", key)
        elif why == "replaced":
            tier.warn_once("replaced", "jaxcache: the shared root's entry %s is not the one its local copy came"
                           " from (replaced since, or no longer vouched for); the copy is dropped and the root's"
                           " entry fetched", key)
        return DROPPED

    # -- the start --------------------------------------------------------------------------------------------------

    def list_small(self, pending: Callable[[], Collection[str]]) -> list[str]:
        """Where the tier holds copies and the root is small (one listing request), check them all against that
        listing (and, signed, keep its signature objects as the origins of what is admitted next); then
        :attr:`listed` is set, however it went. Returns the keys dropped."""
        try:
            return self._list_small(pending)
        finally:
            self.listed.set()

    def _list_small(self, pending: Callable[[], Collection[str]]) -> list[str]:
        tier = self._tier
        waiting = set(pending())
        local = sorted(k for k in self.copies if k not in waiting)
        if not local or not self._listing:
            return []
        try:
            listed = tier.calls.ask(lambda root: small_listing(root, ("-cache", signing.SIG_SUFFIX)),
                                    what="a listing of its entries")
        except UnreachableError:
            return []
        except Exception as exc:  # noqa: BLE001 - each copy is checked on its own instead
            tier.warn_once("list", "jaxcache: could not list the shared root to check the copies in %s (%s); each"
                           " copy is checked when JAX asks for it", tier.directory, exc)
            return []
        self._note_large(listed is None)
        if listed is None:
            return []  # more than one request's worth: each copy is checked on its own
        stats = {name: (size, mtime, version) for name, size, mtime, version in listed}
        if self._signed:
            tier.sigs = {name: stat for name, stat in stats.items() if name.endswith(signing.SIG_SUFFIX)}
        dropped = []
        for key in local:
            with self._lock:
                if key in self._vouched:
                    continue
            origin = tier.origins.read(key)
            if origin is not None and origin.cache is None:
                continue  # a pack's copy: its pack vouches for it, or its bytes are compared when it is checked
            verdict = self._drop(key, "origin") if origin is None else self._judge(
                key, origin, stats.get(entry.cache_name(key)), stats.get(signing.sig_name(key)), None)
            if verdict == LOAD:
                self.vouch(key)
            elif verdict == DROPPED:
                dropped.append(key)
        return dropped

    # -- copies no job asks for ----------------------------------------------------------------------------------

    def sweep(self, pending: Callable[[], Collection[str]], *, workers: int = SWEEP_WORKERS) -> None:
        """After the start's work: temporary files a killed admission left, origins whose copy went, and the copies
        not checked within :data:`CHECK_EVERY_S` (checked ``workers`` at a time, until the root does not answer)."""
        tier = self._tier
        names = os.listdir(tier.directory)
        for name in names:
            if name.startswith(TEMP_PREFIXES):  # never read by JAX, never evicted; a young one may be under way
                path = os.path.join(tier.directory, name)
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - os.stat(path).st_mtime > TEMP_AGE_S:
                        os.unlink(path)
        # In this order: a key another process is writing is marked pending before its entry appears.
        waiting = set(pending())
        present = {n.removesuffix("-cache") for n in names if n.endswith("-cache")}
        for key in tier.origins.keys():  # an origin whose copy went (JAX's own eviction leaves it)
            if key not in present and key not in waiting and not os.path.lexists(
                    os.path.join(tier.directory, entry.cache_name(key))):
                tier.origins.forget(key)
        copies = {k for k in self.copies if k in present and k not in waiting}
        with self._lock:
            copies -= self._vouched
        now = time.time()
        due = sorted(k for k in copies if (at := tier.origins.checked_at(k)) is None or now - at >= CHECK_EVERY_S)
        if not due:
            return
        pool = DaemonPool(workers, "jaxcache-sweep")
        futures = [pool.submit(functools.partial(self._swept, key)) for key in due]
        pool.close()
        for future in futures:
            future.result()

    def _swept(self, key: str) -> Verdict:
        if not self._tier.calls.answering:
            return UNANSWERED  # the rest wait for a job that can ask
        return self.check(key)
