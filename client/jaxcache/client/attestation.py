"""Attestation: the digest of the bytes JAX handed its cache's ``put``, checked against the entry once written.

The digest is taken from the bytes themselves (the JAX wall's put hook), never from a read-back, which would vouch
for whatever was planted before the read. Once JAX has written, one background thread fed by a bounded queue reads
the entry back whole: only when its bytes are the ones put (not torn by a full disk, not planted) does the digest
enter the run record and, with JAXCACHE_SIGNING_KEY, a signature go beside the entry (``<key>-sig``, create-only).
A training step never waits; when the queue is full the entry is left unattested (counted, never blocking).
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from jaxcache import entry, signing, unreadable
from jaxcache.client.reporting import RecordWriter
from jaxcache.client.telemetry import Recorder
from jaxcache.storage import Storage

log = logging.getLogger("jaxcache.client")

QUEUE_SIZE = 1024
NOT_PUT_REASON = "the entry in the cache is not the bytes JAX wrote (replaced or planted meanwhile)"
MAX_PUTS = 4096  # digests of puts not yet checked (hashed on the compiling thread): bounded like the queue


class Attestor:
    """Hashes written entries off the compiling thread and stores the digests in the recorder."""

    def __init__(self, writer: RecordWriter, recorder: Recorder, *, maxsize: int = QUEUE_SIZE,
                 signing_key: signing.SigningKey | None = None, writer_name: Callable[[], str] = lambda: "",
                 broken: Callable[[str, str], str] | None = None, entries: Callable[[], Storage] | None = None,
                 after: Callable[[str, str, int], None] | None = None) -> None:
        self._writer = writer
        # Where JAX writes its entries: the root, or the node-local tier, whose uploader (``after``) then gets
        # each attested write (key, sha256, size) and signs it once it is in the root.
        self._entries = entries or writer.storage
        self._after = after
        self._recorder = recorder
        self._key = signing_key  # JAXCACHE_SIGNING_KEY: what it signs, trusted readers take as proof
        self._writer_name = writer_name  # information beside a signature ("job x run y"), never what it proves
        self._puts: dict[str, tuple[str, int]] = {}  # key -> (sha256, size) of the bytes JAX handed put
        # (key, what is wrong with its entry) -> the reason the record gives, led by its cause (WriteCheck.torn)
        self._broken = broken or (lambda key, what: what)
        self._queue: queue.Queue[tuple[str, float]] = queue.Queue(maxsize=maxsize)
        self._seen: set[str] = set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0
        self.failed = 0

    def on_put(self, key: str, value: bytes) -> tuple[str, int]:
        """The JAX wall's put hook: the digest of the exact bytes JAX is about to store (on the compiling thread;
        hashing bytes in memory costs far less than the compile that made them), and their size."""
        digest = hashlib.sha256(value).hexdigest()
        with self._lock:
            if len(self._puts) >= MAX_PUTS:  # puts whose write never settled (JAX failed it): the oldest go first
                self._puts.pop(next(iter(self._puts)))
            self._puts[key] = (digest, len(value))
        return digest, len(value)

    def submit(self, key: str, looked_up_at: float = 0.0) -> None:
        """Queue a key JAX says it just wrote (having looked it up at ``looked_up_at``); never blocks."""
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jaxcache-attest", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait((key, looked_up_at))
        except queue.Full:
            self.dropped += 1

    def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for queued keys to be hashed (at exit, and before warm-up's coverage)."""
        return drained(self._queue, timeout_s)

    def _run(self) -> None:
        while True:
            key, looked_up_at = self._queue.get()
            try:
                storage = self._entries()
                info = storage.stat(key + "-cache")  # JAX's entry name for a key
                if info is not None and unreadable.there_before(info.mtime_s, looked_up_at):
                    # JAX says "writing" and writes nothing when an entry is there that it could not load: those
                    # bytes are not this process's, and attesting them would vouch for a broken entry.
                    self._recorder.mark_not_written(key, unreadable.REASON)
                    continue
                with self._lock:
                    put = self._puts.pop(key, None)
                if put is None:
                    continue  # the put hook heard nothing (a JAX it cannot hook, or too many at once): unattested
                chunks = storage.read_chunks(key + "-cache")
                if chunks is not None:
                    whole, sha, size = entry.validate_hashing(chunks)
                    if whole.status is not entry.Status.OK:
                        reason = self._broken(key, f"JAX's write left a broken entry ({whole.reason})")
                        self._recorder.mark_not_written(key, reason)
                        continue
                    if (sha, size) != put:
                        self._recorder.mark_not_written(key, NOT_PUT_REASON)
                        continue
                    self._recorder.set_digest(key, sha, size)
                    if self._after is not None:
                        self._after(key, sha, size)
                    elif self._key is not None and not signing.write(
                            storage, self._key.sign(key, sha, size, writer=self._writer_name())):
                        log.warning("jaxcache: %s already has a signature object; this write is left unsigned",
                                    key)
            except Exception as exc:  # noqa: BLE001 - an unreadable entry stays unattested; the job goes on
                self.failed += 1
                log.debug("jaxcache: could not read back %s to attest it: %s", key, exc)
            finally:
                self._queue.task_done()


def drained(work: queue.Queue[Any], timeout_s: float) -> bool:
    """Whether every item put on ``work`` was done (``task_done``) within ``timeout_s``: ``Queue.join`` with a
    bound, on the queue's own condition (no helper thread: at interpreter exit Python >= 3.12 starts none)."""
    with work.all_tasks_done:
        return work.all_tasks_done.wait_for(lambda: not work.unfinished_tasks, timeout_s)
