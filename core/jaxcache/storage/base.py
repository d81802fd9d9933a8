"""The one storage interface every backend implements, and the name rules every backend enforces."""

from __future__ import annotations

import abc
import contextlib
import math
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from jaxcache.errors import EncodedObjectError, InvalidInputError, PathEscapeError, StorageError, TooLargeError
from jaxcache.numbers import decimal


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object under a cache root. ``name`` is relative to the root, with ``/`` separators.

    ``version`` is an opaque token that each store defines for one content of the object, which a replaced object
    does not keep: GCS's generation (as text), the ETag on S3 and on Azure; None on a directory, where size and
    mtime stand for it.
    """

    name: str
    size_bytes: int
    mtime_s: float
    version: str | None = None


#: An object's (size_bytes, mtime_s, version), as Storage.list_changes compares them.
Stat = tuple[int, float, str | None]

#: One object of a whole listing (Storage.list_stats): (name, size_bytes, mtime_s, version).
Listed = tuple[str, int, float, str | None]


def same_stat(a: Stat, b: Stat) -> bool:
    """Whether ``a`` and ``b`` (one name, seen at two times) are one content: the one rule for "the same object"
    that every comparison of two looks uses (the head index, the service's rescans, the node-local tier's copies).
    Where either has a version, the same version and size: a store's version changes with every replacement, while
    its time may move without one (GCS's "updated" moves with a metadata change). Without versions (a directory):
    the same size and mtime, since JAX writes each key once and rewrites an -atime file in place."""
    if a[2] is not None or b[2] is not None:
        return a[2] == b[2] and a[0] == b[0]
    return a[0] == b[0] and a[1] == b[1]


def stat_of(info: ObjectInfo) -> Stat:
    """An object's (size_bytes, mtime_s, version), as a listing gives it."""
    return info.size_bytes, info.mtime_s, info.version


def same_object(a: ObjectInfo, b: ObjectInfo) -> bool:
    """:func:`same_stat` of two :class:`ObjectInfo` of one name."""
    return same_stat(stat_of(a), stat_of(b))


def etag_token(etag: str) -> str:
    """An HTTP ETag in its quoted form, as response headers carry it: listings give it bare on Azure (and on some
    S3-compatible stores), and a version token must read the same from a listing and from a stat."""
    return etag if etag.startswith(('"', 'W/"')) else f'"{etag}"'


#: How much of an object a streaming read holds at a time (Storage.read_chunks).
CHUNK_BYTES = 1 << 20

#: Content codings that leave an object's bytes as stored: ``identity``, and ``aws-chunked``, a framing of an upload
#: that S3 takes off before it stores the bytes (some S3-compatible stores keep the word in the object's metadata).
_AS_STORED = frozenset({"", "identity", "aws-chunked"})


#: A URL's user and password (``user:pass@`` in ``http://user:pass@host/``). A password may hold a ``/`` its writer
#: did not escape: everything up to the ``@`` goes, which at worst leaves out part of a path in a message.
_USERINFO = re.compile(r"(?<=://)[^\s@'\"<>]*@")


def without_userinfo(text: str) -> str:
    """``text`` with the user and password of every URL in it left out (``http://user:pass@host/`` shows as
    ``http://host/``): how an endpoint shows in messages, logs and :attr:`Storage.identity`, and how the text of a
    store library's error that names the URL it asked is passed on."""
    return _USERINFO.sub("", text) if "@" in text else text


def check_endpoint(name: str, value: str, otherwise: str) -> None:
    """Raise :class:`InvalidInputError` naming the variable ``name`` where its ``value`` is not an http(s) URL with a
    host (``notaurl``, ``http://[::1``): a store's library would fail on it with a traceback of its own, or try to
    reach it for minutes. ``otherwise``: what else the user may do (``or unset it for AWS's own``)."""
    try:
        parts = urlsplit(value.strip())
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:  # a bracket without its end, a port that is not a number
        ok = False
    if not ok:
        raise InvalidInputError(f"{name}={without_userinfo(value)[:200]!r} is not an endpoint URL: give "
                                f"http://host:port or https://host, {otherwise}")


def content_coding(header: str | None) -> str | None:
    """The content codings an answer's ``Content-Encoding`` names that change the bytes from those stored (``gzip``),
    or None where it names none: such an object is not one JAX or jaxcache wrote (:class:`EncodedObjectError`)."""
    if not header:
        return None
    codings = [c for c in (part.strip().lower() for part in header.split(",")) if c not in _AS_STORED]
    return ", ".join(codings) or None

def missing_library(scheme: str, libraries: str, extra: str) -> str:
    """What to install for a store's roots: its libraries from the package index, or the core's extra from a clone of
    jaxcache (no jaxcache distribution is on an index to name)."""
    return (f"{scheme} cache roots need {libraries}: pip install {libraries} (from a clone of jaxcache: pip install"
            f" './core[{extra}]')")


def env_seconds(name: str, what: str, most: float) -> float | None:
    """The seconds set in the environment variable ``name`` (0 < s <= ``most``), None where it is unset."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    found = decimal(text)  # ASCII digits of bounded length only: float() takes other scripts' digits and "inf"
    seconds = math.nan if found is None else found
    if not 0 < seconds <= most:
        raise InvalidInputError(f"{name}={text!r}: give the seconds {what} (0 < s <= {most:g})")
    return seconds


#: Seconds a request to a store waits to connect, and then for each next bytes of its answer: one setting for both,
#: for every request of every store, through each library's own (botocore's Config, azure-core's transport,
#: google-cloud-storage's ``timeout`` of each call). Each library's retry policy then tries again as for a dropped
#: connection.
STORE_TIMEOUT_ENV = "JAXCACHE_STORE_TIMEOUT_S"
#: The libraries' own are 60 s (botocore, google-cloud-storage) and 300 s (azure-core), which, times their tries,
#: held a job on a store that stopped answering for minutes. A read timeout bounds the wait between bytes, not a whole
#: object, and what a store sends first comes within a second or two: a listing page (1,000 objects on S3 and GCS,
#: 5,000 on Azure) answers in well under a second on a real store even for a large root, and a store that throttles
#: answers at once (503 SlowDown, 429, 503 ServerBusy; the libraries retry those). 20 s without a byte is a store, or
#: a path to it, that stopped; it leaves ten times the slowest first byte seen on a loaded store.
DEFAULT_STORE_TIMEOUT_S = 20.0


def store_timeout_s() -> float:
    """The connect and read timeout of every request to a store (:data:`STORE_TIMEOUT_ENV`, else the default)."""
    seconds = env_seconds(STORE_TIMEOUT_ENV, "a request to a store waits to connect, and for each next bytes", 600)
    return DEFAULT_STORE_TIMEOUT_S if seconds is None else seconds


def names_gone(previous: Mapping[str, Stat], changed: Mapping[str, Stat], seen: int, storage: Storage) -> set[str]:
    """The names of ``previous`` that a listing which saw ``seen`` of them no longer has. All seen: none (the
    common case, decided by a count); otherwise the root is listed again to find which."""
    if seen == len(previous):
        return set()
    present = {info.name for info in storage.iter_objects()}
    return {name for name in previous if name not in present and name not in changed}


def check_name(name: str) -> str:
    """Return ``name`` if it stays inside the root; raise :class:`PathEscapeError` otherwise."""
    # Fast path for the common case (a plain file name): this runs for every object a scan touches.
    if name and "/" not in name and "\x00" not in name and "\\" not in name and name not in (".", ".."):
        return name
    if not name or "\x00" in name or "\\" in name or name.startswith("/"):
        raise PathEscapeError(f"object name {name!r} is not a relative path inside the cache root")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise PathEscapeError(f"object name {name!r} escapes the cache root or is not normalised")
    return name


def name_problem(name: str) -> str | None:
    """Why a listed object's ``name`` cannot be read as one of the root's (:func:`check_name` refuses it, or it is
    not text: a file name that is not UTF-8), or None. A reader skips such an object and goes on with the rest."""
    try:
        check_name(name)
    except PathEscapeError:
        return "its name is not a relative path inside the cache root (a backslash, NUL, or an empty, '.' or '..' part)"
    if not name.isascii():
        try:
            name.encode()
        except UnicodeEncodeError:  # the bytes of a local file name that does not decode (surrogate escapes)
            return "its name is not valid UTF-8"
    return None


#: How the names of the objects jaxcache reads end. Under a root, anything so named that is not a regular file (a
#: directory, a FIFO, a link) is counted as skipped; other folders (XLA's sub-caches, ``.jaxcache/``) are folders.
OBJECT_SUFFIXES = ("-cache", "-atime", ".json")


class Skipped:
    """The objects readers of one storage instance passed over (not regular files, names that cannot be read): how
    many, and which and why for the first :attr:`MAX_KEPT` (a hostile root may hold millions). Thread-safe."""

    MAX_KEPT = 1000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.reasons: dict[str, str] = {}  # name -> why, in the order found
        self._collectors: tuple[Skipped, ...] = ()

    def add(self, name: str, why: str) -> None:
        """Count ``name`` once, however many readers pass over it."""
        with self._lock:
            collectors = self._collectors
            if name not in self.reasons:
                self.count += 1
                if len(self.reasons) < self.MAX_KEPT:
                    self.reasons[name] = why
        for collector in collectors:  # each counts it once too, seen here before or not
            collector.add(name, why)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[Skipped]:
        """A new :class:`Skipped` told of every object passed over while the block runs, whether counted here before
        or not: what one pass skipped, on a storage that outlives it (the service's, which rescans for days)."""
        collector = Skipped()
        with self._lock:
            self._collectors = (*self._collectors, collector)
        try:
            yield collector
        finally:
            with self._lock:
                self._collectors = tuple(c for c in self._collectors if c is not collector)

    def items(self) -> list[tuple[str, str]]:
        """``(name, why)`` of the kept ones, by name."""
        with self._lock:
            return sorted(self.reasons.items())


def check_prefix(prefix: str) -> str:
    """Like :func:`check_name` for a listing prefix, which may be empty or end in ``/``."""
    if prefix:
        check_name(prefix.rstrip("/") or "/")
    return prefix


class Storage(abc.ABC):
    """A cache root: a local/NFS directory, or a prefix in an object store (``gs://``, ``s3://``, ``az://``).

    Every name is relative to the root. Missing objects are return values (None/False), not exceptions;
    vendor errors surface as :class:`jaxcache.errors.StorageError` subclasses.
    """

    url: str
    #: True when :meth:`iter_objects` yields names in lexicographic order (the object stores do; a directory does
    #: not).
    listing_sorted: bool = False
    #: Bytes worth fetching in a first read of an entry's head. A local read costs the same for 256 bytes or
    #: 64 KiB (which holds most zstd first blocks); on GCS bytes are billed, so ask for little and then exactly.
    head_read_bytes: int = 256
    #: Objects up to this size are read whole in that first read: a small zstd entry is mostly its first block,
    #: which the second read would fetch to its end anyway, so one request costs about the bytes of two.
    head_whole_bytes: int = 0
    #: Requests worth having in flight at once (scans, validation, deletes): a directory gains nothing from
    #: threads, an object store hides its latency behind many.
    io_workers: int = 1
    #: Requests for object bytes this instance made (an open or a GET, found or not): for tests and benchmarks
    #: that must show what a listing read. Under threads a count may be lost; 0 stays exact.
    reads: int = 0

    @property
    def skipped(self) -> Skipped:
        """What this instance's listings and reads skipped so far (see :class:`Skipped`)."""
        found: Skipped | None = self.__dict__.get("_skipped")
        if found is None:  # setdefault: two threads asking first get the same one
            found = self.__dict__.setdefault("_skipped", Skipped())
        return found

    def head_first_read(self, size_bytes: int) -> int:
        """Bytes to ask for in the first read of the head of a ``size_bytes`` entry."""
        return size_bytes if 0 < size_bytes <= self.head_whole_bytes else self.head_read_bytes

    @property
    def identity(self) -> str:
        """What names this root for state kept outside it (the head index): its URL, plus the endpoint where a
        backend may be pointed elsewhere (an emulator holds other objects under the same bucket name)."""
        return self.url

    @abc.abstractmethod
    def iter_objects(self, prefix: str = "", *, recursive: bool = False) -> Iterator[ObjectInfo]:
        """Yield objects lazily. Without ``recursive`` only the objects directly under ``prefix``."""

    @abc.abstractmethod
    def stat(self, name: str) -> ObjectInfo | None:
        """One object's metadata, or None if it does not exist."""

    @abc.abstractmethod
    def read_range(self, name: str, offset: int, length: int) -> bytes | None:
        """Up to ``length`` bytes from ``offset``; None if the object does not exist."""

    @abc.abstractmethod
    def read(self, name: str) -> bytes | None:
        """The whole object, or None if it does not exist."""

    def read_with_info(self, name: str) -> tuple[bytes, ObjectInfo] | None:
        """The whole object and the metadata of the object those bytes came from, or None if it does not exist: what
        names that object to compare with a later listing (its version where the store has them). This default
        asks for the metadata first, so an object replaced in between looks changed later, never the reverse."""
        info = self.stat(name)
        data = None if info is None else self.read(name)
        return None if info is None or data is None else (data, info)

    @abc.abstractmethod
    def delete(self, name: str, *, if_version: str | None = None) -> bool:
        """Delete one object; False if it was already gone.

        ``if_version`` (an :attr:`ObjectInfo.version`) deletes only
        that version and raises :class:`~jaxcache.errors.PreconditionFailedError` if the object was replaced since
        it was listed: through the store's precondition where it has one, else by a check just before the delete.
        """

    @abc.abstractmethod
    def write_atomic(self, name: str, data: bytes, *, create_only: bool = False, if_version: str | None = None) -> None:
        """Write a whole object so that readers see either nothing/the old bytes or all of the new ones.

        ``create_only`` raises :class:`~jaxcache.errors.PreconditionFailedError` if the object exists with
        other bytes (a backend may accept an existing object that holds exactly ``data``: a retried create).
        ``if_version`` (:meth:`version_token` of the object as read earlier) replaces the object only if it is still
        that version, and raises :class:`~jaxcache.errors.PreconditionFailedError` if it was replaced or deleted
        since: a read-modify-write that loses no other writer's update. Unlike a create, an object that holds exactly
        ``data`` is no proof that this write happened (two writers may add the same update), so a library's retry
        of a replace whose first answer was lost may report the precondition failed: read again and redo the
        update (an idempotent one, such as adding to a set, is then found done).
        """

    def version_token(self, info: ObjectInfo) -> str:
        """What :meth:`write_atomic`'s ``if_version`` takes for the object ``info`` describes (from :meth:`stat`,
        :meth:`read_with_info` or a listing): its :attr:`ObjectInfo.version` where the store has versions."""
        if info.version is None:
            raise InvalidInputError(f"{info.name!r} in {self.url} was described without its version")
        return info.version

    def list_changes(self, previous: Mapping[str, Stat]) -> tuple[dict[str, Stat], set[str]]:
        """Compare the objects directly under the root with ``previous`` (``{name: (size_bytes, mtime_s,
        version)}``, an earlier answer's objects): the objects that are new or differ (:func:`same_stat`), and the
        names in ``previous`` that are gone. ``list_changes({})`` is the whole listing. For listing a whole root often
        (the service's rescans), where building an object per file costs as much as the listing itself."""
        changed: dict[str, Stat] = {}
        seen = 0
        for info in self.iter_objects():
            stat = (info.size_bytes, info.mtime_s, info.version)
            if (before := previous.get(info.name)) != stat and (before is None or not same_stat(before, stat)):
                changed[info.name] = stat
            if info.name in previous:
                seen += 1
        return changed, names_gone(previous, changed, seen, self)

    def iter_listing(self) -> Iterator[tuple[str, Stat]]:
        """What ``list_changes({})`` answers, as (name, stat) pairs one at a time: for a caller that keeps the listing
        in a shape of its own (the service's first rescan), without the whole dict by name first."""
        for info in self.iter_objects():
            yield info.name, (info.size_bytes, info.mtime_s, info.version)

    def list_stats(self, suffixes: tuple[str, ...] = ()) -> list[Listed]:
        """The objects directly under the root whose names end in one of ``suffixes`` (every object without), in
        listing order, as ``(name, size_bytes, mtime_s, version)`` tuples: a whole listing without an object per
        file, for callers that compare or keep whole listings (the head index)."""
        return [
            (info.name, info.size_bytes, info.mtime_s, info.version)
            for info in self.iter_objects()
            if not suffixes or info.name.endswith(suffixes)
        ]

    def read_bounded(self, name: str, max_bytes: int, *, listed_bytes: int | None = None) -> bytes | None:
        """The whole object, or None if it does not exist, reading at most ``max_bytes + 1`` bytes of it: one larger
        raises :class:`TooLargeError` (from ``listed_bytes``, its size in a listing, before anything is read). The
        read asks for the listed size plus one, so a small object costs a small read (a 32 MiB buffer per record
        would cost a local read 20 times more); one that grew since it was listed is read again, to the bound."""
        if listed_bytes is not None and listed_bytes > max_bytes:
            raise TooLargeError(f"larger than {max_bytes} bytes")
        want = max_bytes + 1 if listed_bytes is None else listed_bytes + 1
        data = self.read_range(name, 0, want)
        if data is not None and len(data) == want <= max_bytes:  # it grew since the listing
            data = self.read_range(name, 0, max_bytes + 1)
        if data is not None and len(data) > max_bytes:
            raise TooLargeError(f"larger than {max_bytes} bytes")
        return data

    def read_chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes] | None:
        """The whole object as successive chunks of at most ``chunk_bytes`` (memory stays bounded however large it
        is), or None if it does not exist. A backend without a streaming read returns it whole."""
        data = self.read(name)
        return None if data is None else iter((data,))

    def exists(self, name: str) -> bool:
        """True if the object exists."""
        return self.stat(name) is not None

    def ping(self) -> None:
        """Raise a :class:`~jaxcache.errors.StorageError` if the root cannot be reached."""
        next(iter(self.iter_objects()), None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class ObjectStore(Storage):
    """A prefix in an object store's bucket (``scheme://bucket/prefix``): what the stores' backends share. Names are
    keys under ``prefix/``; listings come sorted; requests are worth having many in flight."""

    listing_sorted = True
    io_workers = 16
    # Most entries of a JAX cache are programs of a few KiB: one GET each instead of two, for a few KiB more at
    # most on a multi-block entry of this size.
    head_whole_bytes = 32 * 1024

    def _set_root(self, scheme: str, bucket: str, prefix: str) -> None:
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.url = f"{scheme}://{bucket}/{self.prefix}" if self.prefix else f"{scheme}://{bucket}"
        self._base = f"{self.prefix}/" if self.prefix else ""

    def _key(self, name: str) -> str:
        """The store's key of the object ``name`` under the root."""
        return self._base + check_name(name)

    def _as_stored(self, name: str, content_encoding: str | None) -> None:
        """Raise :class:`EncodedObjectError` (and count ``name`` in :attr:`skipped`) where the ``Content-Encoding`` of
        an answer about the object says its bytes are not as stored: each store's library would decode them, and a
        few MB of gzip grow to GBs before any bound on their size applies. Called before any of its bytes are read
        (after them on GCS, whose library reads the body first: as stored, so within the bound of the request)."""
        coding = content_coding(content_encoding)
        if coding is None:
            return
        why = (f"stored with Content-Encoding {coding[:40]!r}: not an entry, record or signature jaxcache wrote"
               " (never decoded, never read)")
        self.skipped.add(name, why)
        raise EncodedObjectError(f"{self.url}/{name} is {why}")

    def _replaced(self, name: str) -> StorageError:
        """What a streaming read (:meth:`read_chunks`) raises when the version it began with is gone."""
        return StorageError(f"{self.url}/{name} was deleted or replaced while it was read; read it again")
