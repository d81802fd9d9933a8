"""Where each copy in the node-local tier came from: the root's object whose bytes it holds, so that a copy is used
only while that object is still the root's current one (:mod:`jaxcache.client.local_tier`).

One small file per key under ``<tier>/.jaxcache/origin/``: what names the root's ``-cache`` object the copy was read
from (its version in an object store; its size and modification time on a directory) or the pack it was seeded from
(:mod:`jaxcache.client.pack_seed`), the sha256 of the copy's bytes (``verify="attested"`` compares it with the
service's attested digest at each start) and, under ``verify="signed"``, the ``-sig`` object that vouched for those
bytes then. Written once the copy is in place and removed with it; a copy without one (cut off between the two, or
kept by a client before this file existed) is never loaded: it is dropped and fetched again. The file's modification
time is when the copy was last found to be the root's current object (:meth:`Origins.checked`), so that copies no job
asks for are checked at most once a day (:mod:`jaxcache.client.copy_checks`).
"""

from __future__ import annotations

import contextlib
import os

import msgspec

from jaxcache.storage.base import ObjectInfo, Stat, same_stat
from jaxcache.storage.base import stat_of as _stat_of
from jaxcache.storage.files import read_small, write_small

ORIGIN_DIR = os.path.join(".jaxcache", "origin")
MAX_BYTES = 4096  # three (size, mtime, version) triples, a pack's name and a digest, far less


def stat_of(info: ObjectInfo) -> Stat:
    """An object's (size, mtime, version), as a listing gives it."""
    return _stat_of(info)


def same(a: Stat | None, b: Stat | None) -> bool:
    """Whether two looks at a root's object saw the same object (storage's one rule: the same version where the store
    has them, else the same size and modification time)."""
    return a is not None and b is not None and same_stat(a, b)


class PackRef(msgspec.Struct, frozen=True):
    """A pack in the root (:mod:`jaxcache.packs`) as one look saw it: its name and its object's (size, mtime,
    version)."""

    name: str
    object: Stat


class Origin(msgspec.Struct, frozen=True):
    """The root's objects a copy came from: its entry (None: a pack's copy, whose entry was never looked at), and
    (signed) the signature object that vouched for it; the sha256 of the copy's bytes (None: not taken, as no policy
    of its directory reads it, or by an older client); and the pack it was seeded from, which vouches for it while
    that pack is the job's named one (:mod:`jaxcache.client.pack_seed`)."""

    cache: Stat | None
    sig: Stat | None = None
    sha256: str | None = None
    pack: PackRef | None = None


_DECODE = msgspec.json.Decoder(Origin).decode


class Origins:
    """The origin files of one tier directory."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.join(directory, ORIGIN_DIR)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)

    def write(self, key: str, origin: Origin) -> None:
        """Record where ``key``'s copy came from (once the copy is in place)."""
        write_small(os.path.join(self.directory, key), msgspec.json.encode(origin))

    def read(self, key: str) -> Origin | None:
        """Where ``key``'s copy came from; None when nothing (readable) says."""
        raw = read_small(f"{self.directory}/{key}", MAX_BYTES)  # each start reads one a copy: kept lean
        if raw is None or len(raw) > MAX_BYTES:
            return None
        try:
            return _DECODE(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def checked(self, key: str) -> None:
        """``key``'s copy was just found to be the root's current object."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(os.path.join(self.directory, key))

    def checked_at(self, key: str) -> float | None:
        """When ``key``'s copy was last found to be the root's current object (admitted, uploaded or checked): a
        Unix time; None without an origin."""
        try:
            return os.stat(os.path.join(self.directory, key)).st_mtime
        except FileNotFoundError:
            return None

    def forget(self, key: str) -> None:
        """The copy is gone, or its bytes are now JAX's own: its origin no longer says anything."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, key))

    def keys(self) -> list[str]:
        """The keys with an origin file."""
        return [n for n in os.listdir(self.directory) if not n.startswith(".")]
