"""The head index: what one listing of a cache root learnt about its entries, kept for the next listing of that root.

An entry's head (compression, stored compile seconds, whether it decodes) cannot change while the object stays the same:
JAX never rewrites a key. So each listing keeps the entries it built, with what says "the same object" (size and mtime
in a directory; the store's version and size in an object store: storage.same_stat) for them and their -atime files, and
the next one reads only what is new or changed (jaxcache.scan_indexed compares). One file per root, named by a hash of
the root's identity, in ``$JAXCACHE_INDEX_DIR``, else ``$XDG_CACHE_HOME/jaxcache/heads``, else
``~/.cache/jaxcache/heads``; never inside the root (JAX and other users own it). ``JAXCACHE_INDEX=off`` turns it off. A
file that cannot be read or decoded is ignored with one warning and written anew, one of another format version replaced
silently; writers replace the file whole (a temporary file renamed over it), so concurrent listings never see half of
one. Saving an index sweeps the files of roots nobody listed for :data:`UNUSED_DAYS`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import time
import warnings
from collections.abc import Callable, Sequence

import msgspec

from jaxcache.scan import Entry, Orphan
from jaxcache.storage.base import Listed, Storage
from jaxcache.storage.files import READ_FLAGS

INDEX_ENV = "JAXCACHE_INDEX"
INDEX_DIR_ENV = "JAXCACHE_INDEX_DIR"
_OFF = frozenset({"off", "0", "false", "no"})

#: The first line of every index file, then this format's version and the layout of what follows. A change to how a
#: head is judged (compression, compile seconds, status) bumps the version: indexes and kept answers are then rebuilt.
_MAGIC = b"jaxcache head index "
FORMAT_VERSION = 1

#: A root's index and kept answers that no listing has used for this long are removed when another index is saved:
#: roots come and go (CI runners, copies, unmounted volumes), and a 100k-entry root's files take tens of MB.
UNUSED_DAYS = 30
_SUFFIX = ".heads"
_TMP_PREFIX = ".tmp-"

#: The -atime file's (size_bytes, mtime_s, version) for the entry at the same position, or None without one.
AtimeStamp = tuple[int, float, str | None] | None


class HeadIndexWarning(UserWarning):
    """The head index could not be used (unreadable, corrupt, unwritable, or inside the root)."""


class Snapshot(msgspec.Struct, array_like=True):
    """What one listing built, and the listing it was built from."""

    identity: str
    #: blake2b of the listing (name, size, mtime, version of each -cache and -atime object, in listing order).
    listing_digest: bytes
    #: Every entry of that listing holds its head (False after listings that did not need heads: an object store's
    #: `ls`).
    heads_complete: bool
    entries: list[Entry]
    #: Aligned with ``entries``; raw, since only a listing that differs from this one needs it.
    atime_stamps: msgspec.Raw
    orphans: list[Orphan]

    def decode_atime_stamps(self) -> list[AtimeStamp]:
        """``atime_stamps`` decoded; raises ``ValueError`` (or msgspec's DecodeError, one) where they do not match
        ``entries``."""
        stamps = msgspec.msgpack.decode(self.atime_stamps, type=list[AtimeStamp])
        if len(stamps) != len(self.entries):
            raise ValueError(f"{len(stamps)} -atime stamps for {len(self.entries)} entries")
        return stamps


def listing_digest(listing: Sequence[Listed]) -> bytes:
    """A digest of a whole listing: equal digests, same objects in the same order (a changed one has a new size,
    mtime or version)."""
    return hashlib.blake2b(msgspec.msgpack.encode(listing), digest_size=16).digest()


def enabled() -> bool:
    """False when ``JAXCACHE_INDEX`` says off (``off``, ``0``, ``false``, ``no``)."""
    return os.environ.get(INDEX_ENV, "").strip().lower() not in _OFF


def index_dir() -> str:
    """Where index files live: ``$JAXCACHE_INDEX_DIR``, else the user's cache directory (XDG)."""
    explicit = os.environ.get(INDEX_DIR_ENV)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is to be ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxcache", "heads")


def _schema() -> bytes:
    # The layout of a Snapshot, its entries and orphans: a field added, removed or retyped makes older files another
    # format, replaced rather than misread.
    layout = repr([(f.name, repr(f.type)) for t in (Snapshot, Entry, Orphan) for f in msgspec.structs.fields(t)])
    return hashlib.sha256(layout.encode()).hexdigest()[:12].encode()


def index_header() -> bytes:
    """The first line of an index file of this format and layout (what else a listing keeps is keyed on it)."""
    return _MAGIC + b"v%d %s\n" % (FORMAT_VERSION, _schema())


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _warn_by_default(message: str) -> None:
    warnings.warn(message, HeadIndexWarning, stacklevel=3)


class HeadIndex:
    """One root's index file: :meth:`load` what the last listing kept, :meth:`save` what this one built. Problems
    with the file are never errors: they are reported once through ``warn`` and the listing reads every head."""

    def __init__(self, path: str, identity: str, *, warn: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.identity = identity
        self._warn = warn or _warn_by_default
        self._warned = False
        #: Whether the last :meth:`save` wrote the file (tests, benchmarks).
        self.saved = False

    @classmethod
    def for_storage(cls, storage: Storage, *, warn: Callable[[str], None] | None = None) -> HeadIndex | None:
        """The index of ``storage``'s root; None where ``JAXCACHE_INDEX`` is off or the index directory would be
        inside a local root (reported through ``warn``)."""
        if not enabled():
            return None
        directory = index_dir()
        root = getattr(storage, "root", None)
        if isinstance(root, str) and _inside(directory, root):
            (warn or _warn_by_default)(
                f"the head index directory {directory} is inside the cache root {root}: listing without an index "
                f"(set {INDEX_DIR_ENV} to a directory outside it)"
            )
            return None
        name = hashlib.sha256(storage.identity.encode()).hexdigest()[:32] + _SUFFIX
        return cls(os.path.join(directory, name), storage.identity, warn=warn)

    def used(self) -> None:
        """Mark the root's index as used now (its mtime), which keeps it and the root's kept answers from being
        swept (:data:`UNUSED_DAYS`)."""
        with contextlib.suppress(OSError):
            os.utime(self.path)

    def warn(self, message: str) -> None:
        """Report a problem with the index, the first time only."""
        if not self._warned:
            self._warned = True
            self._warn(message)

    def load(self) -> Snapshot | None:
        """What the last listing saved, or None (no index yet, another format, or unusable: warned)."""
        try:
            # Never through a link, never waiting on a FIFO planted under its name: a listing must not hang on it.
            fd = os.open(self.path, READ_FLAGS)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file")
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None  # none yet (saving says so if it cannot be made)
        except OSError as exc:
            self.warn(f"cannot read the head index {self.path} ({exc.strerror or exc}): reading every entry's head")
            return None
        header = index_header()
        if not data.startswith(header):
            if not data.startswith(_MAGIC):
                self._corrupt("it is not a head index")
            return None  # another version's: this listing writes ours in its place
        try:
            snapshot = msgspec.msgpack.decode(memoryview(data)[len(header) :], type=Snapshot)
        except (msgspec.DecodeError, ValueError) as exc:
            self._corrupt(str(exc))
            return None
        if snapshot.identity != self.identity:
            self._corrupt(f"it describes {snapshot.identity}")
            return None
        return snapshot

    def previous_entries(self, snapshot: Snapshot) -> dict[str, tuple[Entry, AtimeStamp]]:
        """``snapshot``'s entries by object name, each with its -atime file's stamp; empty (warned) where the
        stamps cannot be decoded: then every entry is read again."""
        try:
            stamps = snapshot.decode_atime_stamps()
        except ValueError as exc:  # msgspec.DecodeError is a ValueError
            self._corrupt(str(exc))
            return {}
        return {e.name: (e, st) for e, st in zip(snapshot.entries, stamps, strict=True)}

    def _corrupt(self, why: str) -> None:
        self.warn(f"ignoring the corrupt head index {self.path} ({why}): reading every entry's head and writing it "
                  "again")

    def save(self, snapshot: Snapshot) -> None:
        """Replace the file with ``snapshot``, whole (a reader sees the old file or the new one)."""
        try:
            # No fsync: a file torn by a crash fails to decode and is rebuilt; the next listing pays, nothing is lost.
            write_whole(self.path, index_header(), msgspec.msgpack.encode(snapshot))
            self.saved = True
        except OSError as exc:
            self.warn(f"cannot save the head index {self.path} ({exc.strerror or exc}): the next listing reads every "
                      f"head again; set {INDEX_DIR_ENV} to a writable directory, or {INDEX_ENV}=off")
            return
        sweep(os.path.dirname(self.path))


def sweep(directory: str, *, now: float | None = None) -> list[str]:
    """Remove the index files and kept answers in ``directory`` of roots whose index no listing used (or saved) for
    :data:`UNUSED_DAYS`, and temporary files as old; the names removed. Files of other names are left alone, and a
    file that cannot be removed is left for the next sweep."""
    horizon = (time.time() if now is None else now) - UNUSED_DAYS * 86400
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    last_use: dict[str, float] = {}
    for name in names:
        if name.endswith(_SUFFIX):
            with contextlib.suppress(OSError):
                last_use[name.removesuffix(_SUFFIX)] = os.stat(os.path.join(directory, name)).st_mtime
    removed = []
    for name in names:
        path = os.path.join(directory, name)
        stem, dot, _ = name.partition(".")
        if name.startswith(_TMP_PREFIX):
            stale = _older(path, horizon)  # left by a crash; one being written now is new
        elif dot and len(stem) == 32 and all(c in "0123456789abcdef" for c in stem):
            # A kept answer goes with its root's index; one without an index, by its own age.
            stale = last_use[stem] < horizon if stem in last_use else _older(path, horizon)
        else:
            continue  # not ours
        if stale:
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(name)
    return removed


def _older(path: str, horizon: float) -> bool:
    try:
        return os.stat(path).st_mtime < horizon
    except OSError:
        return False


def write_whole(path: str, *parts: bytes) -> None:
    """Replace ``path`` with ``parts`` through a temporary file renamed over it (its directory made if need be),
    so that a reader sees the old file or the new one; raises OSError."""
    import tempfile  # only to save: a listing the index answers writes nothing

    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
