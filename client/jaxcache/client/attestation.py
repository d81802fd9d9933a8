"""Attestation: a digest of every entry this process wrote, read back once JAX has finished writing it.

The digest goes into the run record, so the catalog can later tell the entry's bytes from tampered ones. Hashing
happens on one background thread fed by a bounded queue: a training step never waits for it, and when the queue
is full the entry is simply left unattested (counted, never blocking). The same read decompresses the entry whole:
one torn after its head (a disk that filled up mid-write) is no write of this process either.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from jaxcache import entry
from jaxcache.attestations import sign
from jaxcache.client.misses import SLACK_S
from jaxcache.client.reporting import RecordWriter
from jaxcache.client.telemetry import Recorder

log = logging.getLogger("jaxcache.client")

QUEUE_SIZE = 1024
UNREADABLE_REASON = ("the cache holds an entry for this key that JAX could not load; JAX does not rewrite an entry"
                     " that exists")


class Attestor:
    """Hashes written entries off the compiling thread and stores the digests in the recorder."""

    def __init__(self, writer: RecordWriter, recorder: Recorder, *, maxsize: int = QUEUE_SIZE,
                 secret: bytes | None = None, broken: Callable[[str, str], str] | None = None) -> None:
        self._writer = writer
        self._recorder = recorder
        self._secret = secret  # JAXCACHE_ATTEST_KEY: digests signed with it outrank anyone else's
        # (key, what is wrong with its entry) -> the reason the record gives, led by its cause (WriteCheck.torn)
        self._broken = broken or (lambda key, what: what)
        self._queue: queue.Queue[tuple[str, float]] = queue.Queue(maxsize=maxsize)
        self._seen: set[str] = set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0
        self.failed = 0

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
        # Polls instead of joining on a helper thread: at interpreter exit (where this runs) Python >= 3.12
        # refuses to start threads.
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _run(self) -> None:
        while True:
            key, looked_up_at = self._queue.get()
            try:
                storage = self._writer.storage()
                info = storage.stat(key + "-cache")  # JAX's entry name for a key
                if info is not None and info.mtime_s < looked_up_at - SLACK_S:
                    # JAX says "writing" and writes nothing when an entry is there that it could not load: those
                    # bytes are not this process's, and attesting them would vouch for a broken entry.
                    self._recorder.mark_not_written(key, UNREADABLE_REASON)
                    continue
                chunks = storage.read_chunks(key + "-cache")
                if chunks is not None:
                    whole, sha, size = _read_whole(chunks)
                    if whole.status is not entry.Status.OK:
                        reason = self._broken(key, f"JAX's write left a broken entry ({whole.reason})")
                        self._recorder.mark_not_written(key, reason)
                        continue
                    signature = sign(self._secret, key, sha) if self._secret is not None else None
                    self._recorder.set_digest(key, sha, size, signature)
            except Exception as exc:  # noqa: BLE001 - an unreadable entry stays unattested; the job goes on
                self.failed += 1
                log.debug("jaxcache: could not read back %s to attest it: %s", key, exc)
            finally:
                self._queue.task_done()


def _read_whole(chunks: Iterable[bytes]) -> tuple[entry.Validation, str, int]:
    """Decompress an entry whole while hashing its bytes, as one stream (entries of hundreds of MB stay out of
    memory): what the decompression found, the sha256 of the bytes, their size."""
    digest, size = hashlib.sha256(), 0

    def hashed() -> Iterator[bytes]:
        nonlocal size
        for chunk in chunks:
            digest.update(chunk)
            size += len(chunk)
            yield chunk

    stream = hashed()
    whole = entry.validate_chunks(stream)
    for _ in stream:  # bytes the decompression left unread still enter the digest
        pass
    return whole, digest.hexdigest(), size
