"""Did JAX's write of an entry leave it there whole? Asked on the compiling thread as soon as JAX returns.

JAX says "writing" and fires its write event *before* it writes, and turns a failed write into a warning: on a full
disk it leaves a zero-byte file behind and the process goes on. The run record's ``write`` event is what the
service's "first writer" of an entry is built from, so the client counts a write only once the entry is found
there, non-empty, with a head that decodes (:func:`jaxcache.entry.read_header`); otherwise the key is "compiled,
not written" with the reason this module gives.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from jaxcache import entry
from jaxcache.client.attestation import UNREADABLE_REASON
from jaxcache.client.misses import SLACK_S
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
UNCHECKED = "could not be read back"


class WriteCheck:
    """``check(key, looked_up_at)``: None when the key's entry is there whole, else why it is not (one line).

    ``storage`` opens the root (lazily: google-cloud-storage loads only for gs:// roots); ``local_dir`` is the
    root's directory for free-space checks, None for a bucket (which has no disk to fill).
    """

    def __init__(self, storage: Callable[[], Storage], local_dir: str | None) -> None:
        self._storage = storage
        self._local_dir = local_dir
        self._warned = False
        self._lock = threading.Lock()

    def __call__(self, key: str, looked_up_at: float) -> str | None:
        reason = self._check(key, looked_up_at)
        if reason is not None and reason != UNREADABLE_REASON:
            self._warn_once(key, reason)
        return reason

    def _check(self, key: str, looked_up_at: float) -> str | None:
        name = entry.cache_name(key)
        try:
            storage = self._storage()
            info = storage.stat(name)
            if info is None:
                return self.broken("JAX said it was writing the entry, and none is there")
            if info.mtime_s < looked_up_at - SLACK_S:
                # There before the lookup: JAX could not load it, and writes nothing over an entry that exists.
                return UNREADABLE_REASON
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

