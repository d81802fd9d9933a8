"""Write-behind: what JAX writes to the node-local tier is uploaded to the shared root, off the training path.

JAX's put is heard before it stores (the put hook): the key is marked pending (``.jaxcache/pending/<key>``), so no
other process drops it as "gone from the root" meanwhile. The mark holds the digest and size of the bytes JAX put,
their signature (``JAXCACHE_SIGNING_KEY``) and the process's lock file under ``.jaxcache/live/``, held while it runs:
a later process resuming the upload sends only a file that matches, with that signature, and leaves a running
process's mark alone. Once the attestor found the write whole and as put, one thread creates the entry in the root
(create-only), then its signature, and keeps the copy's origin. A failed upload is a warning and a count; the mark
stays for the node's next process, as it does while the root is not answering (no upload tried then, none waited
for at exit: :mod:`jaxcache.client.root_calls`). In a signed directory a write is also marked unverified
(``.jaxcache/unverified/``) until this process signs exactly those bytes in the root: the next start drops it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import filelock
import msgspec

from jaxcache import entry, signing
from jaxcache.client.copy_checks import TEMP_AGE_S
from jaxcache.client.local_tier import PENDING_DIR, UNVERIFIED_DIR, LocalTier
from jaxcache.client.origins import Origin, stat_of
from jaxcache.errors import PreconditionFailedError, UnreachableError
from jaxcache.storage.files import read_small, write_small
from jaxcache.units import plural

log = logging.getLogger("jaxcache.client")

QUEUE_SIZE = 4096
MARK_MAX_BYTES = 64 * 1024  # a pending mark: a digest and one signature, far less
LIVE_DIR = os.path.join(".jaxcache", "live")  # one lock file per running process of the node's tier
_OWNER = re.compile(r"[0-9]{1,10}-[0-9a-f]{8}")  # <pid>-<random>: the name of a process's lock file


@dataclass(frozen=True, slots=True)
class Put:
    """What JAX put under a key, kept as its pending mark: the bytes' digest and size, and their signature."""

    sha256: str
    size_bytes: int
    signature: signing.Signature | None = None
    owner: str | None = None  # the lock file of the process that put them (LIVE_DIR), held while it runs

    def to_bytes(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_bytes(cls, data: bytes, key: str) -> Put | None:
        """The mark's put, or None when it holds none (a mark of an older client, or not one of ours)."""
        try:
            put = msgspec.json.decode(data, type=cls)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None
        if put.signature is not None and (put.signature.key, put.signature.sha256, put.signature.size_bytes) != (
                key, put.sha256, put.size_bytes):
            return None
        return put


class Uploader:
    """Uploads local writes to the root on one daemon thread, fed by a bounded queue (never blocking JAX)."""

    def __init__(self, tier: LocalTier, *, signing_key: signing.SigningKey | None,
                 writer_name: Callable[[], str] = lambda: "", signed_dir: bool = False) -> None:
        self._tier = tier
        self._calls = tier.calls
        self._key = signing_key
        self._writer_name = writer_name
        self._pending = os.path.join(tier.directory, PENDING_DIR)
        os.makedirs(self._pending, mode=0o700, exist_ok=True)
        self._unverified: str | None = None  # where writes no trusted signature covers yet are marked
        if signed_dir:
            self._unverified = os.path.join(tier.directory, UNVERIFIED_DIR)
            os.makedirs(self._unverified, mode=0o700, exist_ok=True)
        # (key, sha256 and size of the bytes JAX put, or None for a write an earlier process left pending)
        self._queue: queue.Queue[tuple[str, tuple[str, int] | None]] = queue.Queue(maxsize=QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._waiting: set[str] = set()  # not tried while the root did not answer: tried once it answers again
        self._calls.on_answer(self._root_answers)
        self._calls.on_silent(self._root_silent)
        self._live = os.path.join(tier.directory, LIVE_DIR)
        os.makedirs(self._live, mode=0o700, exist_ok=True)
        self.owner: str | None = None  # without a lock file, marks say no owner (as an older client's)
        self._alive: filelock.FileLock | None = None
        for name in os.listdir(self._live):
            self._running(name)  # the lock files of processes that ended go
        for _ in range(3):
            name = f"{os.getpid()}-{secrets.token_hex(4)}"
            alive = filelock.FileLock(os.path.join(self._live, name), timeout=0)
            try:
                alive.acquire()  # held until this process ends: its marks are not for others to clear
            except Exception as exc:  # noqa: BLE001 - marks without an owner, as before
                log.debug("jaxcache: could not take %s: %s", alive.lock_file, exc)
                break
            if os.path.exists(alive.lock_file):  # not swept away by another process in the instant before flock
                self.owner, self._alive = name, alive
                break
            alive.release()

    def _running(self, owner: str | None) -> bool:
        """Whether ``owner`` (a mark's) is another process of this node that still runs: it holds its lock file."""
        if owner is None or owner == self.owner or not _OWNER.fullmatch(owner):
            return False
        path = os.path.join(self._live, owner)
        if not os.path.exists(path):
            return False
        probe = filelock.FileLock(path, timeout=0)
        try:
            probe.acquire()
        except (filelock.Timeout, OSError):  # held, or not to be judged: taken as running, its mark left alone
            return True
        probe.release()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return False

    def pending(self) -> list[str]:
        """The keys written here whose upload has not finished (by this process or an earlier one)."""
        return [n for n in os.listdir(self._pending) if not n.startswith(".")]

    def unverified(self) -> list[str]:
        """In a directory of signed entries: the keys JAX wrote here that no signature of this client covers."""
        return [] if self._unverified is None else [n for n in os.listdir(self._unverified) if not n.startswith(".")]

    def forget_unverified(self, keys: list[str]) -> None:
        """Unmark keys whose local copies were dropped."""
        for key in keys:
            self._unmark(self._unverified, key)

    def on_put(self, key: str, sha256: str, size_bytes: int) -> None:
        """The put hook, before JAX stores the bytes of that digest and size: sign them (with
        ``JAXCACHE_SIGNING_KEY``) and mark the key pending with both (a tiny local write on the compiling thread)."""
        sig = None if self._key is None else self._key.sign(key, sha256, size_bytes, writer=self._writer_name())
        self._tier.origins.forget(key)  # the bytes there are JAX's own from now on, whatever a copy came from
        write_small(os.path.join(self._pending, key), Put(sha256, size_bytes, sig, self.owner).to_bytes())
        if self._unverified is not None:
            write_small(os.path.join(self._unverified, key), b"")

    def submit(self, key: str, sha256: str, size_bytes: int) -> None:
        """Upload a write the attestor found whole and equal to what JAX put; never blocks."""
        self._enqueue(key, (sha256, size_bytes))

    def resume(self, keys: list[str]) -> None:
        """Upload writes earlier processes left pending (checked whole again first)."""
        for key in keys:
            self._enqueue(key, None)

    def _enqueue(self, key: str, put: tuple[str, int] | None) -> None:
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="jaxcache-upload", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # at interpreter exit Python >= 3.12 starts no threads: upload here
                    started = False
                else:
                    self._thread, started = thread, True
            else:
                started = True
        if not started:
            self._handle(key, put)  # on the attestor's thread, which the exit's bounded wait covers
            return
        try:
            self._queue.put_nowait((key, put))
        except queue.Full:
            pass  # stays pending: the next process on this node uploads it

    def drain(self, timeout_s: float, *, final: bool = False) -> bool:
        """Wait up to ``timeout_s`` for queued uploads, and not at all while the root is taken as not answering; at
        exit (``final``) the unfinished ones are counted as pending, with a warning."""
        work = self._queue
        with work.all_tasks_done:
            done = work.all_tasks_done.wait_for(lambda: not work.unfinished_tasks or not self._calls.answering,
                                                timeout_s)
            left = work.unfinished_tasks
        with self._lock:
            waiting = len(self._waiting)
        if done and not left and not waiting:
            return True
        if final:
            self._tier.add(upload_pending=left + waiting)
            log.warning("jaxcache: %s to the shared root did not finish %s; their entries stay in %s and the next"
                        " job on this node uploads them", plural(left + waiting, "upload"),
                        "as it did not answer" if not self._calls.answering else f"within {timeout_s:.0f} s",
                        self._tier.directory)
        return False

    def _root_silent(self) -> None:
        with self._queue.all_tasks_done:
            self._queue.all_tasks_done.notify_all()  # the exit's wait for uploads ends

    def _root_answers(self) -> None:
        with self._lock:
            keys, self._waiting = sorted(self._waiting), set()
        self.resume(keys)

    def _run(self) -> None:
        while True:
            key, put = self._queue.get()
            try:
                self._handle(key, put)
            finally:
                self._queue.task_done()

    def _handle(self, key: str, put: tuple[str, int] | None) -> None:
        try:
            self._upload(key, put)
        except UnreachableError:
            with self._lock:
                self._waiting.add(key)  # its mark stays: uploaded once the root answers, or by the node's next job
        except Exception as exc:  # noqa: BLE001 - a failed upload never fails the job
            self._tier.add(upload_failed=1)
            self._tier.warn_once("upload", "jaxcache: could not upload %s to the shared root (%s); it stays in %s"
                                 " and the next job on this node tries again (uploads that fail are counted in the"
                                 " run record)", key, exc, self._tier.directory)

    def _upload(self, key: str, put: tuple[str, int] | None) -> None:
        name = entry.cache_name(key)
        started = time.monotonic()
        kept = self._mark(key)  # the put's mark: its bytes go, with the signature made when JAX put them
        if put is None and kept is not None and self._running(kept.owner):
            return  # another process's put, and it still runs: it uploads its write (which may not be there yet)
        data = self._tier.storage.read(name)
        if data is None:
            self._done(key)  # evicted or dropped meanwhile: nothing to upload
            return
        sha, size = hashlib.sha256(data).hexdigest(), len(data)
        if put is not None and (sha, size) != put:
            self._done(key)  # replaced since the attestor read it: not the bytes this process put
            return
        if kept is None or (sha, size) != (kept.sha256, kept.size_bytes):
            if put is None:  # an earlier process's put: only its bytes go
                self._refuse(key, name, data, kept is None)
                return
            kept = None  # this process's own put, whose mark was lost: the attestor found the bytes JAX put
        sig = kept.signature if kept is not None else (
            None if self._key is None else self._key.sign(key, sha, size, writer=self._writer_name()))
        # Not bounded by the lookups' deadline: an entry may take longer than that to send. The exit's wait is.
        try:
            self._calls.send(lambda root: root.write_atomic(name, data, create_only=True))
        except PreconditionFailedError:
            self._done(key)  # another writer's entry is there: the root keeps the first
            return
        self._tier.add(uploaded=1, uploaded_bytes=size, uploaded_s=time.monotonic() - started)
        try:  # the copy is the root's object now; without its origin the next start fetches it again
            info = self._calls.send(lambda root: root.stat(name))
            if info is not None:
                self._tier.origins.write(key, Origin(stat_of(info), sha256=sha))  # the digest JAX put
                self._tier.checks.vouch(key)
        except Exception as exc:  # noqa: BLE001 - uploaded all the same
            log.debug("jaxcache: could not read back what %s is in the root: %s", key, exc)
        if sig is not None:
            if self._calls.send(lambda root: signing.write(root, sig)):
                self._unmark(self._unverified, key)  # signed: exactly these bytes, in the root and here
            else:
                log.warning("jaxcache: %s already has a signature object; this write is left unsigned", key)
        self._done(key)

    def _mark(self, key: str) -> Put | None:
        try:
            raw = read_small(os.path.join(self._pending, key), MARK_MAX_BYTES)
        except OSError:
            return None
        return None if raw is None or len(raw) > MARK_MAX_BYTES else Put.from_bytes(raw, key)

    def _refuse(self, key: str, name: str, data: bytes, unknown: bool) -> None:
        """A pending write whose file is not the bytes JAX put (per its mark), or whose mark says nothing."""
        info = self._tier.storage.stat(name)
        young = info is not None and time.time() - info.mtime_s <= TEMP_AGE_S
        if young and entry.validate(data).status is not entry.Status.OK:
            return  # torn and recent: JAX's write (not atomic) may be under way in another process
        with self._tier.lock():  # never loaded, never uploaded: JAX compiles the program again
            self._tier.remove(key)
        self._done(key)
        self._tier.add(upload_refused=1)
        self._tier.warn_once("refused", "jaxcache: not uploading %s from %s: %s; the local file is removed (and"
                             " counted in the run record)", key, self._tier.directory,
                             "its pending mark does not say which bytes JAX put" if unknown else
                             "it is not the bytes JAX put")

    def _done(self, key: str) -> None:
        kept = self._mark(key)
        if kept is not None and self._running(kept.owner):
            return  # marked again since, by a process that still runs: its mark, for its own upload
        self._unmark(self._pending, key)

    @staticmethod
    def _unmark(folder: str | None, key: str) -> None:
        if folder is not None:
            try:
                os.unlink(os.path.join(folder, key))
            except FileNotFoundError:
                pass
