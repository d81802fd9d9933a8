"""Write-behind: what JAX writes to the node-local tier is uploaded to the shared root, off the training path.

JAX's put is heard before it stores (the put hook): the key is marked pending in the local directory
(``.jaxcache/pending/<key>``), so no other process drops it as "gone from the root" meanwhile. Once the attestor has
read the write back whole and its bytes are the ones put, one background thread creates the entry in the root
(create-only: an entry there already is never replaced) and then, with ``JAXCACHE_SIGNING_KEY``, its signature.
A failed upload is a warning and a count; the mark stays, and the next process on the node tries again. In a
directory of signed entries a write is also marked unverified (``.jaxcache/unverified/<key>``) until this process
signs exactly those bytes in the root: the next start drops it, so a verified copy from the root replaces it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from jaxcache import entry, signing
from jaxcache.client.attestation import drained
from jaxcache.client.local_tier import PENDING_DIR, TEMP_AGE_S, UNVERIFIED_DIR, LocalTier
from jaxcache.errors import PreconditionFailedError
from jaxcache.storage import Storage
from jaxcache.units import plural

log = logging.getLogger("jaxcache.client")

QUEUE_SIZE = 4096


class Uploader:
    """Uploads local writes to the root on one daemon thread, fed by a bounded queue (never blocking JAX)."""

    def __init__(self, tier: LocalTier, root: Callable[[], Storage], *, signing_key: signing.SigningKey | None,
                 writer_name: Callable[[], str] = lambda: "", signed_dir: bool = False) -> None:
        self._tier = tier
        self._root = root
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

    def on_put(self, key: str, _value: bytes) -> None:
        """The put hook, before JAX stores: mark the key pending (a tiny local write on the compiling thread)."""
        for folder in (self._pending, self._unverified):
            if folder is not None:
                with open(os.path.join(folder, key), "wb"):
                    pass

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
        """Wait up to ``timeout_s`` for queued uploads; at exit (``final``) the unfinished ones are counted as
        pending, with a warning."""
        if drained(self._queue, timeout_s):
            return True
        if final:
            left = self._queue.unfinished_tasks
            self._tier.add(upload_pending=left)
            log.warning("jaxcache: %s to the shared root did not finish within %.0f s; their entries stay"
                        " in %s and the next job on this node uploads them", plural(left, "upload"), timeout_s,
                        self._tier.directory)
        return False

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
        except Exception as exc:  # noqa: BLE001 - a failed upload never fails the job
            self._tier.add(upload_failed=1)
            self._tier.warn_once("upload", "jaxcache: could not upload %s to the shared root (%s); it stays in %s"
                                 " and the next job on this node tries again (uploads that fail are counted in the"
                                 " run record)", key, exc, self._tier.directory)

    def _upload(self, key: str, put: tuple[str, int] | None) -> None:
        name = entry.cache_name(key)
        started = time.monotonic()
        data = self._tier.storage.read(name)
        if data is None:
            self._done(key)  # evicted or dropped meanwhile: nothing to upload
            return
        sha, size = hashlib.sha256(data).hexdigest(), len(data)
        if put is None and entry.validate(data).status is not entry.Status.OK:
            # Torn: JAX's write (not atomic) is under way in another process, or its process died inside it. Never
            # uploaded; removed once old enough that no write can still be going on.
            info = self._tier.storage.stat(name)
            if info is not None and time.time() - info.mtime_s > TEMP_AGE_S:
                with self._tier.lock():
                    self._tier.remove(key)
                self._done(key)
            return
        if put is not None and (sha, size) != put:
            self._done(key)  # replaced since the attestor read it: not the bytes this process put
            return
        root = self._root()
        try:
            root.write_atomic(name, data, create_only=True)
        except PreconditionFailedError:
            self._done(key)  # another writer's entry is there: the root keeps the first
            return
        self._tier.add(uploaded=1, uploaded_bytes=size, uploaded_s=time.monotonic() - started)
        if self._key is not None:
            if signing.write(root, self._key.sign(key, sha, size, writer=self._writer_name())):
                self._unmark(self._unverified, key)  # signed: exactly these bytes, in the root and here
            else:
                log.warning("jaxcache: %s already has a signature object; this write is left unsigned", key)
        self._done(key)

    def _done(self, key: str) -> None:
        self._unmark(self._pending, key)

    @staticmethod
    def _unmark(folder: str | None, key: str) -> None:
        if folder is not None:
            try:
                os.unlink(os.path.join(folder, key))
            except FileNotFoundError:
                pass
