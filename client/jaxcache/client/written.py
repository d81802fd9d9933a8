"""Did JAX's write of an entry leave it there whole? Asked on the compiling thread as soon as JAX returns.

JAX says "writing" and fires its write event *before* it writes, and turns a failed write into a warning: on a full
disk it leaves a zero-byte file behind and the process goes on. The run record's ``write`` event is what the
service's "first writer" of an entry is built from, so the client counts a write only once the entry is found
there, non-empty, with a head that decodes (:func:`jaxcache.entry.read_header`); otherwise the key is "compiled,
not written" with the reason this module gives.

JAX's ``put`` writes nothing when the entry's file exists. Whether it existed is asked once more right before
JAX's put (:meth:`WriteCheck.before_put`, from the put hook): an entry written moments earlier by another run
is as much not this process's write as one written an hour ago, and the entry's mtime alone cannot tell them
apart within the clocks' slack.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from jaxcache import entry, unreadable
from jaxcache.storage import Storage
from jaxcache.units import format_bytes

log = logging.getLogger("jaxcache.client")

#: Less free space than this on a root's volume after a failed write: the write ran out of space. An entry of a
#: large GPU program is tens of MiB, so a volume this close to full fails its writes.
DISK_FULL_BYTES = 64 * 1024 * 1024
#: The causes a reason starts with (``"<cause>: <details>"``): what the summary groups failed writes by.
DISK_FULL = "disk full"
NO_INODES = "no free inodes"
NOT_WHOLE = "not written whole"
#: Keys noted by before_put and not yet checked (a put JAX failed is never checked): the oldest go first.
MAX_NOTED = 4096
UNCHECKED = "could not be read back"


class WriteCheck:
    """``check(key, looked_up_at)``: None when the key's entry is there whole, else why it is not (one line).

    ``storage`` opens the root (lazily: a store's client library loads only for its roots); ``local_dir`` is the
    root's directory for free-space checks, None for a bucket (which has no disk to fill).
    """

    def __init__(self, storage: Callable[[], Storage], local_dir: str | None) -> None:
        self._storage = storage
        self._local_dir = local_dir
        self._warned = False
        self._lock = threading.Lock()
        self._there_at_put: dict[str, bool] = {}  # keys whose entry existed when JAX went to put it (bounded)

    def __call__(self, key: str, looked_up_at: float) -> str | None:
        reason = self._check(key, looked_up_at)
        if reason is not None and not unreadable.said(reason):
            self._warn_once(key, reason)
        return reason

    def before_put(self, key: str) -> None:
        """Note whether the key's entry exists now, as JAX is about to put it (then JAX writes nothing)."""
        try:
            there = self._storage().stat(entry.cache_name(key)) is not None
        except Exception:  # noqa: BLE001 - the put hook must never break a write; the mtime check still runs
            return
        if there:
            with self._lock:
                if len(self._there_at_put) >= MAX_NOTED:
                    self._there_at_put.pop(next(iter(self._there_at_put)))
                self._there_at_put[key] = True

    def _check(self, key: str, looked_up_at: float) -> str | None:
        name = entry.cache_name(key)
        with self._lock:
            there_at_put = self._there_at_put.pop(key, False)
        if there_at_put:
            return unreadable.REASON
        try:
            storage = self._storage()
            info = storage.stat(name)
            if info is None:
                return self.broken("JAX said it was writing the entry, and none is there")
            if unreadable.there_before(info.mtime_s, looked_up_at):  # without a put hook: the entry's age tells
                # There before the lookup: JAX could not load it, and writes nothing over an entry that exists.
                return unreadable.REASON
            header = entry.read_header(lambda offset, length: storage.read_range(name, offset, length) or b"",
                                       info.size_bytes, first_read_bytes=storage.head_first_read(info.size_bytes))
        except Exception as exc:  # noqa: BLE001 - telemetry must never break a compile; an unchecked write is no claim
            return f"{UNCHECKED}: JAX said it was writing the entry, and reading it back failed ({exc})"
        if header.status is entry.Status.OK:
            return None
        return self.broken(f"JAX's write left a broken entry ({header.reason})")

    def torn(self, key: str, what: str) -> str:
        """Why an entry whose head passed is no write after all (read back whole, it is broken); warns once."""
        reason = self.broken(what)
        self._warn_once(key, reason)
        return reason

    def broken(self, what: str) -> str:
        """``what`` went wrong, led by the cause: the volume's free space or inodes when they ran out."""
        if self._local_dir is not None:
            try:
                st = os.statvfs(self._local_dir)
            except OSError:
                pass
            else:
                free = st.f_bavail * st.f_frsize
                if st.f_files and st.f_favail == 0:
                    return f"{NO_INODES}: {what}; no inode left on the cache's volume"
                if free < DISK_FULL_BYTES:
                    return f"{DISK_FULL}: {what}; {format_bytes(free)} free on the cache's volume"
        return f"{NOT_WHOLE}: {what}"

    def _warn_once(self, key: str, reason: str) -> None:
        with self._lock:
            first, self._warned = not self._warned, True
        if first:
            log.warning("jaxcache: JAX's write of %s did not leave a whole entry (%s); it counts as compiled, not"
                        " written, and the run record and the summary say so for every such program", key, reason)

