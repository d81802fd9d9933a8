"""The last answer of a command over a root, kept beside its head index and given again while the listing is the same.

A repeated ``jaxcache ls --json`` of an unchanged 100k-entry root would otherwise spend, after its one unavoidable
listing, as long again sorting and encoding 40 MB of JSON that it printed last time. The answer depends on nothing
but the listing (names, sizes, mtimes or versions of every ``-cache`` and ``-atime`` object: the head index's
digest), what the objects held then (fixed while those stay the same), the command's options and the root's URL as
printed. So it is kept under that digest and options, and any change to the root (a new, removed, grown, rewritten
or touched object) makes it another listing, answered afresh. One file per root and command, replaced whole; an
unreadable or foreign file is simply not an answer.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

from jaxcache.head_index import HeadIndex, index_header, write_whole

_MAGIC = b"jaxcache answer v1 "


class KeptAnswer:
    """``command``'s answer for ``index``'s root under ``options`` (the values its output depends on), as kept for
    the listing of ``digest``."""

    def __init__(self, index: HeadIndex, command: str, options: tuple[object, ...], digest: bytes) -> None:
        self.path = f"{index.path.removesuffix('.heads')}.{command}"
        self._index = index
        # The index's own format and layout too: an upgrade that reads heads differently bumps it (head_index).
        key = hashlib.sha256(repr((index_header(), index.identity, command, options)).encode()).hexdigest()
        self._header = _MAGIC + f"{key} {digest.hex()} ".encode()

    def open(self) -> BinaryIO | None:
        """The kept answer, as a file positioned at its start; or None."""
        header = self._header
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - the caller's to close
        except OSError:
            return None  # none yet, or unreadable: the command answers afresh (and says so if it cannot save)
        try:
            # The answer's length ends the header: a file torn by a crash (no fsync) is shorter than it says.
            if f.read(len(header)) == header:
                length = f.readline(24)
                if length.endswith(b"\n") and length[:-1].isdigit():
                    if os.fstat(f.fileno()).st_size - f.tell() == int(length):
                        return f
        except OSError:
            pass
        f.close()
        return None

    def get(self) -> bytes | None:
        """The kept answer, or None."""
        f = self.open()
        if f is None:
            return None
        with f:
            try:
                return f.read()
            except OSError:
                return None

    def put(self, answer: bytes) -> None:
        """Keep ``answer``; a directory that cannot take it is warned about once, by the index."""
        try:
            write_whole(self.path, self._header, b"%d\n" % len(answer), answer)
        except OSError as exc:
            self._index.warn(f"cannot save the last answer in {os.path.dirname(self.path)} ({exc.strerror or exc}): "
                             "the next listing answers afresh")
