"""A cache root on a local or NFS directory."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Mapping
from functools import partial
from typing import BinaryIO

from jaxcache.errors import (
    InvalidRootError,
    PreconditionFailedError,
    RootGoneError,
    StorageError,
    StoragePermissionError,
)
from jaxcache.parallel import forked_half
from jaxcache.storage.base import (
    CHUNK_BYTES,
    Listed,
    ObjectInfo,
    Stat,
    Storage,
    check_name,
    check_prefix,
    names_gone,
)

_TMP_PREFIX = ".jaxcache-tmp-"


#: A listing of at least this many files stats its second half in a forked child meanwhile (jaxcache.parallel):
#: 100k entries (200k files) listed in 0.44-0.49 s where one process took 0.54-0.64 s on 2 CPUs.
FORK_MIN_STATS = 16_384


def _stat_names(fd: int, names: list[str]) -> list[tuple[int, float] | None]:
    """Size and mtime of each of ``names`` in the directory ``fd``; None for one deleted since it was listed."""
    out: list[tuple[int, float] | None] = []
    add, stat = out.append, os.stat
    for name in names:
        try:
            st = stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            add(None)
            continue
        add((st.st_size, st.st_mtime))
    return out


def _absent(exc: OSError) -> bool:
    # A name longer than the file system allows names no file: JAX could not have written it.
    return isinstance(exc, FileNotFoundError) or exc.errno == errno.ENAMETOOLONG


class LocalStorage(Storage):
    """A directory. Listing order is the file system's (not sorted); there are no generations."""

    listing_sorted = False
    head_read_bytes = 64 * 1024

    def __init__(self, root: str | os.PathLike[str], *, must_exist: bool = True) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.url = self.root
        self._mounted = os.path.ismount(self.root)  # seen as a mount point: from then on it must be one
        if must_exist and not os.path.isdir(self.root):
            if os.path.exists(self.root):
                raise InvalidRootError(f"cache root {self.root} is not a directory")
            raise InvalidRootError(
                f"cache root {self.root} does not exist: check the path, or run a JAX job with "
                "jax_compilation_cache_dir pointing there first"
            )

    def _gone(self) -> RootGoneError | None:
        # An unmounted NFS volume must not list as an empty cache: a rescan would drop every row of it. Its mount
        # point may stay behind as an empty directory: a root seen as a mount point must still be one.
        if os.path.isdir(self.root):
            if os.path.ismount(self.root):
                self._mounted = True
            elif self._mounted:
                return RootGoneError(
                    f"cache root {self.root} was a mount point and is not any more (an unmounted volume?): it is"
                    " not listed, so nothing is taken as deleted and nothing is pruned until it is back"
                )
            return None
        what = "is not a directory" if os.path.exists(self.root) else "does not exist"
        return RootGoneError(
            f"cache root {self.root} {what} (an unmounted volume?): it cannot be listed, so nothing is taken as"
            " deleted and nothing is pruned until it is back"
        )

    def _check_root(self) -> None:
        """Called when an object is not there: that says nothing about the object when the whole root is gone."""
        if gone := self._gone():
            raise gone

    def _path(self, name: str) -> str:
        return f"{self.root}/{check_name(name)}"

    def _error(self, op: str, name: str, exc: OSError) -> StorageError:
        # The one place OS errors become ours, with the root and the operation in the message.
        if isinstance(exc, PermissionError):
            return StoragePermissionError(
                f"{op} {name!r} under {self.root}: permission denied; "
                "run as a user that may access the cache directory"
            )
        return StorageError(f"{op} {name!r} under {self.root} failed: {exc.strerror or exc}")

    @contextlib.contextmanager
    def _translate(self, op: str, name: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise self._error(op, name, exc) from exc

    def iter_objects(self, prefix: str = "", *, recursive: bool = False) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        if gone := self._gone():
            raise gone
        base = prefix.rstrip("/")
        top = os.path.join(self.root, base) if base else self.root
        yield from self._walk(top, base, recursive)

    def _walk(self, directory: str, rel: str, recursive: bool) -> Iterator[ObjectInfo]:
        try:
            it = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError) as exc:
            if gone := self._gone():
                raise gone from None
            if isinstance(exc, FileNotFoundError):
                return  # a folder under the root that is not there (yet): nothing in it
            raise self._error("list", rel or ".", exc) from exc
        except OSError as exc:
            raise self._error("list", rel or ".", exc) from exc
        with it:
            for de in it:
                name = f"{rel}/{de.name}" if rel else de.name
                try:
                    if de.is_file(follow_symlinks=False):
                        if de.name.startswith(_TMP_PREFIX):
                            continue
                        st = de.stat(follow_symlinks=False)
                        yield ObjectInfo(name, st.st_size, st.st_mtime)
                    elif recursive and de.is_dir(follow_symlinks=False):
                        yield from self._walk(de.path, name, recursive)
                except FileNotFoundError:
                    continue  # deleted while we listed: not there any more

    def list_changes(self, previous: Mapping[str, Stat]) -> tuple[dict[str, Stat], set[str]]:
        # _walk for the root only, comparing as it goes: a rescan lists every file of a large root every few
        # minutes, mostly unchanged, so an unchanged file costs one lookup and no object of its own.
        changed: dict[str, Stat] = {}
        seen = 0
        if gone := self._gone():
            raise gone
        try:
            it = os.scandir(self.root)
        except (FileNotFoundError, NotADirectoryError):
            raise self._gone() or StorageError(f"listing {self.root} failed: it changed while listed") from None
        except OSError as exc:
            raise self._error("list", ".", exc) from exc
        with it:
            for de in it:
                name = de.name
                try:
                    st = de.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted while we listed
                old = previous.get(name)
                if old is not None and old[0] == st.st_size and old[1] == st.st_mtime:
                    seen += 1
                    continue
                if de.is_file(follow_symlinks=False) and not name.startswith(_TMP_PREFIX):
                    seen += old is not None
                    changed[name] = (st.st_size, st.st_mtime, None)
        return changed, names_gone(previous, changed, seen, self)

    def list_stats(self, suffixes: tuple[str, ...] = ()) -> list[Listed]:
        # The root only, as list_changes: a repeated `jaxcache ls` costs this listing and little else, so it is the
        # tightest loop that gives the answer. Through a descriptor of the root, each stat is an fstatat() relative
        # to it rather than a lookup of the whole path again.
        if gone := self._gone():
            raise gone
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            raise self._gone() or StorageError(f"listing {self.root} failed: it changed while listed") from None
        except OSError as exc:
            raise self._error("list", ".", exc) from exc
        try:
            with os.scandir(fd) as it:  # names and types only: d_type, no stat yet
                names = [de.name for de in it if (not suffixes or de.name.endswith(suffixes))
                         and de.is_file(follow_symlinks=False) and not de.name.startswith(_TMP_PREFIX)]
            stats = forked_half(partial(_stat_names, fd), names, min_items=FORK_MIN_STATS)
        except OSError as exc:
            raise self._error("list", ".", exc) from exc
        finally:
            os.close(fd)
        return [(name, st[0], st[1], None) for name, st in zip(names, stats, strict=True) if st is not None]

    # stat() and read_range() run once or twice per entry in a scan: plain try/except, no context manager.
    def stat(self, name: str) -> ObjectInfo | None:
        try:
            st = os.stat(self._path(name), follow_symlinks=False)
        except OSError as exc:
            if _absent(exc):
                self._check_root()
                return None
            raise self._error("stat", name, exc) from exc
        return ObjectInfo(name, st.st_size, st.st_mtime)

    def read_range(self, name: str, offset: int, length: int) -> bytes | None:
        self.reads += 1
        try:
            fd = os.open(self._path(name), os.O_RDONLY)
        except OSError as exc:
            if _absent(exc):
                self._check_root()
                return None
            raise self._error("read", name, exc) from exc
        try:
            return os.pread(fd, length, offset)
        except OSError as exc:
            raise self._error("read", name, exc) from exc
        finally:
            os.close(fd)

    def read(self, name: str) -> bytes | None:
        self.reads += 1
        path = self._path(name)
        with self._translate("read", name):
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                if not _absent(exc):
                    raise
                self._check_root()
                return None

    def read_chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes] | None:
        self.reads += 1
        path = self._path(name)
        with self._translate("read", name):
            try:
                f = open(path, "rb")  # noqa: SIM115 - closed by the generator, which owns it from here
            except OSError as exc:
                if not _absent(exc):
                    raise
                self._check_root()
                return None
        return self._chunks(f, name, chunk_bytes)

    def _chunks(self, f: BinaryIO, name: str, chunk_bytes: int) -> Iterator[bytes]:
        with f, self._translate("read", name):
            while chunk := f.read(chunk_bytes):
                yield chunk

    def delete(self, name: str, *, if_generation: int | None = None) -> bool:
        # A directory has no generations; JAX never rewrites a key, so there is nothing to compare.
        path = self._path(name)
        with self._translate("delete", name):
            try:
                os.unlink(path)
            except OSError as exc:
                if not _absent(exc):
                    raise
                self._check_root()
                return False
        return True

    def write_atomic(self, name: str, data: bytes, *, create_only: bool = False) -> None:
        path = self._path(name)
        directory = os.path.dirname(path)
        with self._translate("write", name):
            os.makedirs(directory, exist_ok=True)
            import tempfile  # on first write: reading a root (the common case) never needs it

            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=directory)
            try:
                # mkstemp makes 0600 files; others that read the root (the service, other jobs) read JAX's
                # entries, which follow the umask, so ours should be as readable.
                os.fchmod(fd, 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if create_only:
                    # link() fails if the target exists, which makes "create if absent" atomic.
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        raise PreconditionFailedError(f"{name!r} already exists under {self.root}") from None
                else:
                    os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
