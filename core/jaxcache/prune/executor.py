"""The executor: delete what a plan says, each ``-cache`` before its ``-atime``, and account for every object.

JAX treats a missing ``-cache`` as a miss and a lone ``-atime`` as harmless, so that order is safe for running
jobs. In an object store the version the listing saw is a precondition: an object replaced since then is left alone
(through the store's own precondition: GCS's generation match, If-Match on S3 and Azure).
Applying the same plan again after a crash ends in the same state as one clean run (a missing object counts as
already gone); a crash between an entry's two deletes leaves its ``-atime`` as an orphan, which only
``orphans=True`` removes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from jaxcache import entry as fmt
from jaxcache.errors import NotRegularFileError, PreconditionFailedError, RootGoneError, StorageError
from jaxcache.parallel import bounded_map
from jaxcache.prune.candidates import Decision
from jaxcache.prune.planner import PrunePlan
from jaxcache.signing import sig_name
from jaxcache.storage.base import Storage
from jaxcache.storage.local import LocalStorage

if TYPE_CHECKING:
    import filelock

LOGGER = "jaxcache.prune"

#: The lock file JAX's own LRU keeps in a local cache root, and how long JAX itself waits for it.
JAX_LOCKFILE = ".lockfile"
JAX_LOCK_TIMEOUT_S = 10.0

@dataclass(slots=True)
class PruneResult:
    """What :func:`apply` did."""

    deleted: int = 0
    bytes_freed: int = 0
    already_gone: int = 0
    changed: int = 0  # precondition failed: the object was replaced since the listing; left alone
    failed: int = 0  # could not be deleted (``errors`` says why): still there
    errors: list[str] = field(default_factory=list)


_DELETED, _GONE, _CHANGED, _FAILED = "deleted", "gone", "changed", "failed"


Lock = Callable[[], contextlib.AbstractContextManager[None]]


class _JaxLruLock:
    """JAX's own LRU lock, taken the way JAX takes it: ``filelock.FileLock`` on ``<root>/.lockfile``, which JAX
    holds around every cache read and write when ``jax_compilation_cache_max_size`` is set.

    Held around each entry's two deletions, so JAX's eviction, which lists ``-cache`` files and then reads each
    one's ``-atime``, never sees an entry half deleted (it would fail that write and every later one). Taking it
    costs an open, a flock and a close, more than the two deletions, so it is kept across the entries of up to
    ``HOLD_S``: JAX then waits at most that long. If it cannot be had within JAX's own timeout (a stuck holder) or
    at all, deletion goes on without it for the rest of the run: still safe for jobs, which turn read errors into
    warnings. :meth:`close` releases it.
    """

    HOLD_S = 0.02

    def __init__(self, path: str, timeout_s: float = JAX_LOCK_TIMEOUT_S) -> None:
        # Imported here, where a root has JAX's LRU: filelock was a fifth of what a dry run imports.
        import filelock

        self._lock: filelock.FileLock = filelock.FileLock(path, timeout=timeout_s, thread_local=False)
        self._mutex = threading.Lock()  # one entry at a time, whichever thread deletes it
        self._usable = True
        self._since: float | None = None  # when this run took the file lock, while it holds it

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._mutex:
            if self._usable and self._since is None:
                try:
                    self._lock.acquire()
                    self._since = time.monotonic()
                except OSError as exc:  # filelock.Timeout (JAX's own wait ran out) is one too
                    self._usable = False
                    import logging  # here: a prune that never meets a stuck lock need not import it

                    logging.getLogger(LOGGER).warning("prune goes on without JAX's cache lock %s: %s",
                                                      self._lock.lock_file, exc)
            try:
                yield
            finally:
                if self._since is not None and time.monotonic() - self._since >= self.HOLD_S:
                    self._release()

    def _release(self) -> None:
        self._since = None
        self._lock.release()

    def close(self) -> None:
        """Release the file lock if this run still holds it."""
        with self._mutex:
            if self._since is not None:
                self._release()


#: Linux's ``FS_IOC_GETFLAGS`` and the inode flags (``lsattr``) that make unlink() fail even for root.
_FS_IOC_GETFLAGS = 0x80086601
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20


def _inode_flags(path: str) -> int:
    """``path``'s inode flags, or 0 where they cannot be read (not Linux, a file system without them, gone)."""
    if sys.platform != "linux":
        return 0
    import fcntl  # Linux only: see above

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        # The kernel writes an int; the request's size field says long, so give it room for one.
        return int.from_bytes(fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(8))[:4], sys.byteorder)
    except OSError:
        return 0
    finally:
        os.close(fd)


def _flag(path: str) -> tuple[str, str] | None:
    """The flag on ``path`` that refuses every unlink in or of it, and the command that clears it."""
    flags = _inode_flags(path)
    if flags & _FS_IMMUTABLE_FL:
        return "immutable (chattr +i)", "chattr -i"
    if flags & _FS_APPEND_FL:
        return "append-only (chattr +a)", "chattr -a"
    return None


def _why_not_deleted(storage: Storage, name: str, exc: StorageError) -> str:
    """Why ``name`` could not be deleted, in words a user can act on: on a directory root the storage error says
    "permission denied" or "Is a directory" for causes that running as another user does not fix."""
    if not isinstance(storage, LocalStorage):
        return str(exc)
    path = os.path.join(storage.root, name)
    where = f"{name!r} under {storage.root}"
    if os.path.isdir(path) and not os.path.islink(path):
        return f"{where} is a directory, not a file JAX wrote: jaxcache deletes only files; move or remove it by hand"
    if found := _flag(path):
        return f"{where} is {found[0]}: not even root may delete it; `{found[1]}` on it lets it be deleted"
    if found := _flag(os.path.dirname(path)):
        return (f"{where} cannot be deleted: its directory is {found[0]}, so nothing in it may be deleted; "
                f"`{found[1]}` on the directory lets it be")
    return str(exc)


@contextlib.contextmanager
def _lock_for(storage: Storage) -> Iterator[Lock]:
    """JAX's LRU lock on a local root where JAX's LRU is on (a ``.lockfile`` exists); a no-op elsewhere."""
    path = os.path.join(storage.root, JAX_LOCKFILE) if isinstance(storage, LocalStorage) else None
    if path is None or not os.path.isfile(path):
        yield contextlib.nullcontext
        return
    lock = _JaxLruLock(path)
    try:
        yield lock
    finally:
        lock.close()


def _delete_signature(storage: Storage, key: str) -> None:
    """A deleted entry's ``-sig`` goes with it; one left behind is an orphan ``prune --orphans`` removes."""
    try:
        storage.delete(sig_name(key))
    except StorageError:
        pass  # a folder named like it, or a failure: left for --orphans


def _delete_one(
    storage: Storage, lock: Lock, jax_lru: bool, decision: Decision
) -> tuple[Decision, str, str | RootGoneError | None]:
    c = decision.candidate
    try:
        with lock():
            if c.orphan and c.version is None and storage.exists(fmt.cache_name(c.key)):
                # The entry came back since the listing (a job wrote the key again): this -atime is its own.
                # Deleting it would leave a -cache without -atime, which breaks every write of JAX's LRU.
                return decision, _CHANGED, None
            present = storage.delete(c.name, if_version=c.version)
            if not c.orphan:
                _delete_signature(storage, c.key)
            # Where JAX's LRU is on every entry gets an -atime, possibly just after the listing looked: try anyway.
            if c.orphan or not (c.has_atime or jax_lru):
                return decision, _DELETED if present else _GONE, None
            try:
                storage.delete(fmt.atime_name(c.key), if_version=c.atime_version)
            except PreconditionFailedError:
                pass  # a job wrote this key again since the listing: the -atime is the new entry's
            except NotRegularFileError:
                pass  # a folder named like the -atime: not JAX's, left alone (counted in storage.skipped)
            except RootGoneError as exc:
                # The root went away between the entry and its -atime: the entry is gone and counts; then the
                # whole prune stops, as below.
                return decision, _DELETED if present else _GONE, exc
            except StorageError as exc:
                why = _why_not_deleted(storage, fmt.atime_name(c.key), exc)
                return decision, _DELETED if present else _GONE, f"{c.key}: deleted the entry but not its -atime: {why}"
    except PreconditionFailedError:
        return decision, _CHANGED, None
    except RootGoneError:
        raise  # not this entry's failure: the whole prune stops
    except StorageError as exc:
        return decision, _FAILED, _why_not_deleted(storage, c.name, exc)
    return decision, _DELETED if present else _GONE, None


def apply(
    storage: Storage,
    plan: PrunePlan,
    *,
    on_deleted: Callable[[Decision], None] | None = None,
    workers: int | None = None,
) -> PruneResult:
    """Delete what ``plan`` says, in its order; return counts. Keeps going past per-object failures (``failed``,
    each with why in ``errors``: an immutable file, a directory named like an entry), but raises
    :class:`~jaxcache.errors.RootGoneError` when a local root is not there (its entries would all look gone).

    Each entry's ``-cache`` goes before its ``-atime``, with ``if_version`` from the listing (object stores): an object
    replaced since then counts as ``changed`` and is left alone; a missing one counts as ``already_gone``.
    ``on_deleted`` runs in the calling thread, in plan order, once per decision whose entry is gone afterwards
    (deleted now or already gone). ``workers`` defaults to the backend's ``io_workers`` (1 on a directory,
    16 on an object store). Idempotent: applying the same plan again after a crash ends in the same state as one
    clean run.
    """
    if workers is None:
        workers = storage.io_workers
    if plan.delete:
        storage.ping()
    result = PruneResult()
    with _lock_for(storage) as lock:
        work = partial(_delete_one, storage, lock, lock is not contextlib.nullcontext)
        for decision, outcome, error in bounded_map(work, plan.delete, workers=workers):
            if outcome == _DELETED:
                result.deleted += 1
                result.bytes_freed += decision.candidate.size_bytes
            elif outcome == _GONE:
                result.already_gone += 1
            elif outcome == _CHANGED:
                result.changed += 1
            else:
                result.failed += 1
            if isinstance(error, str):
                result.errors.append(error)
            if on_deleted is not None and outcome in (_DELETED, _GONE):
                on_deleted(decision)
            if isinstance(error, RootGoneError):
                raise error
    return result
