"""A cache root on a local or NFS directory."""

from __future__ import annotations

import contextlib
import errno
import os
import stat as st_mode
from collections.abc import Iterator, Mapping
from functools import partial
from typing import BinaryIO, cast

from jaxcache.errors import (
    InvalidInputError,
    InvalidRootError,
    NotRegularFileError,
    PreconditionFailedError,
    RootGoneError,
    StorageError,
    StoragePermissionError,
)
from jaxcache.parallel import forked_half
from jaxcache.storage.base import (
    CHUNK_BYTES,
    OBJECT_SUFFIXES,
    Listed,
    ObjectInfo,
    Stat,
    Storage,
    check_name,
    check_prefix,
    names_gone,
    same_stat,
)
from jaxcache.storage.files import (
    DIR_FLAGS,
    NOT_REGULAR,
    NOT_REGULAR_ERRNOS,
    READ_FLAGS,
    absent,
    kind_of,
    not_regular_why,
    open_dir,
    stat_names,
)

_TMP_PREFIX = ".jaxcache-tmp-"
#: How a directory's version tokens begin (LocalStorage.version_token): its size and mtime follow.
_TOKEN_PREFIX = "stat:"


#: A listing of at least this many files stats its second half in a forked child meanwhile (jaxcache.parallel):
#: 100k entries (200k files) listed in 0.44-0.49 s where one process took 0.54-0.64 s on 2 CPUs.
FORK_MIN_STATS = 16_384


class LocalStorage(Storage):
    """A directory. Listing order is the file system's (not sorted); objects have no versions."""

    listing_sorted = False
    head_read_bytes = 64 * 1024

    def __init__(self, root: str | os.PathLike[str], *, must_exist: bool = True) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.url = self.root
        self._mounted = os.path.ismount(self.root)  # seen as a mount point: from then on it must be one
        self._root_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the root when last found in place
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
        try:
            st = os.stat(self.root)
        except OSError:
            st = None
        if st is not None and st_mode.S_ISDIR(st.st_mode):
            if os.path.ismount(self.root):
                self._mounted = True
            elif self._mounted:
                return RootGoneError(
                    f"cache root {self.root} was a mount point and is not any more (an unmounted volume?): it is"
                    " not listed, so nothing is taken as deleted and nothing is pruned until it is back"
                )
            self._root_id = (st.st_dev, st.st_ino)
            return None
        what = "is not a directory" if st is not None else "does not exist"
        return RootGoneError(
            f"cache root {self.root} {what} (an unmounted volume?): it cannot be listed, so nothing is taken as"
            " deleted and nothing is pruned until it is back"
        )

    def _check_root(self) -> None:
        """Called when an object is not there: that says nothing about the object when the whole root is gone."""
        # The full check (a stat, and ismount's two more) runs once; after it, one stat says whether the root is still
        # the same directory on the same volume (an unmounted volume's mount point is another device), so a scan of a
        # root without -atime files costs one system call per missing file here rather than three and path work.
        try:
            st = os.stat(self.root)
        except OSError:
            st = None
        if st is not None and self._root_id == (st.st_dev, st.st_ino):
            return
        if gone := self._gone():
            raise gone

    def _not_regular(self, name: str, kind: str) -> NotRegularFileError:
        self.skipped.add(name, not_regular_why(kind))
        return NotRegularFileError(
            f"{name!r} under {self.root} is {kind}, not a regular file: skipped (never opened: it could block a "
            "reader or lead it out of the root)"
        )

    def _open_file(self, op: str, name: str) -> int | None:
        """A descriptor of the regular file ``name``, or None if there is none. Raises :class:`NotRegularFileError`
        for anything else (counted in :attr:`skipped`), without following a link or waiting on a FIFO."""
        check_name(name)
        slash = name.rfind("/")
        try:
            if slash < 0:  # a root's entries: one open, as before
                fd = os.open(f"{self.root}/{name}", READ_FLAGS)
            else:
                dir_fd = open_dir(self.root, name[:slash].split("/"))
                try:
                    fd = os.open(name[slash + 1 :], READ_FLAGS, dir_fd=dir_fd)
                finally:
                    os.close(dir_fd)
        except OSError as exc:
            if absent(exc) or exc.errno == errno.ENOTDIR:  # ENOTDIR: a file where a folder of the name should be
                self._check_root()
                return None
            if exc.errno in NOT_REGULAR_ERRNOS:
                raise self._not_regular(name, "a socket" if exc.errno == errno.ENXIO else "a symbolic link") from None
            raise self._error(op, name, exc) from exc
        try:
            mode = os.fstat(fd).st_mode
        except OSError as exc:
            os.close(fd)
            raise self._error(op, name, exc) from exc
        if not st_mode.S_ISREG(mode):
            os.close(fd)
            raise self._not_regular(name, kind_of(mode))
        return fd

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
        try:
            fd = open_dir(self.root, base.split("/") if base else [])
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link where a folder of the prefix should be: not followed
                self.skipped.add(base, not_regular_why("a symbolic link or leads through one"))
                return
            if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                if gone := self._gone():
                    raise gone from None
                if isinstance(exc, FileNotFoundError):
                    return  # a folder under the root that is not there (yet): nothing in it
            raise self._error("list", base or ".", exc) from exc
        yield from self._walk(fd, base, recursive)

    def _skip_odd(self, fd: int, name: str, de: os.DirEntry[str]) -> None:
        """Count ``de`` (not a regular file) as skipped if it is named like an object jaxcache reads."""
        if not de.name.endswith(OBJECT_SUFFIXES):
            return  # another folder (.jaxcache/, XLA's), or something of no one's we know: not ours to report
        try:
            kind = "a symbolic link" if de.is_symlink() else kind_of(
                os.stat(de.name, dir_fd=fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return
        self.skipped.add(name, not_regular_why(kind))

    def _walk(self, fd: int, rel: str, recursive: bool) -> Iterator[ObjectInfo]:
        """The objects in the folder ``fd`` (closed at the end), which is ``rel`` under the root."""
        try:
            try:
                it = os.scandir(fd)
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
                            continue
                        self._skip_odd(fd, name, de)
                        if recursive and de.is_dir(follow_symlinks=False):
                            try:
                                inner = os.open(de.name, DIR_FLAGS, dir_fd=fd)
                            except OSError as exc:
                                if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                                    continue  # gone, or replaced by a link or a file since listed
                                raise self._error("list", name, exc) from exc
                            yield from self._walk(inner, name, recursive)
                    except FileNotFoundError:
                        continue  # deleted while we listed: not there any more
        finally:
            os.close(fd)

    def list_changes(self, previous: Mapping[str, Stat]) -> tuple[dict[str, Stat], set[str]]:
        seen = [0]
        changed = dict(self._changes(previous, seen))
        return changed, names_gone(previous, changed, seen[0], self)

    def iter_listing(self) -> Iterator[tuple[str, Stat]]:
        return self._changes({}, [0])

    def _changes(self, previous: Mapping[str, Stat], seen_out: list[int]) -> Iterator[tuple[str, Stat]]:
        """The root's files that are new or differ from ``previous`` (every one, against none), as (name, stat); how
        many of ``previous`` were listed unchanged or changed goes in ``seen_out[0]`` at the end."""
        # _walk for the root only, comparing as it goes: a rescan lists every file of a large root every few
        # minutes, mostly unchanged, so an unchanged file costs one lookup and no object of its own.
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
                stat = (st.st_size, st.st_mtime, None)
                # Equal tuples first (C-fast, and what an unchanged file gives), then storage's one rule on the rest.
                if old is not None and (old == stat or same_stat(old, stat)):
                    seen += 1
                    continue
                if de.is_file(follow_symlinks=False) and not name.startswith(_TMP_PREFIX):
                    seen += old is not None
                    yield name, stat
                elif name.endswith(OBJECT_SUFFIXES) and not st_mode.S_ISREG(st.st_mode):  # a rescan shows these
                    self.skipped.add(name, not_regular_why(kind_of(st.st_mode)))
        seen_out[0] = seen

    def list_stats(self, suffixes: tuple[str, ...] = ()) -> list[Listed]:
        # The root only, as list_changes: a repeated `jaxcache ls` costs this listing and little else, so it is the
        # tightest loop that gives the answer. Through a descriptor of the root, each stat is an fstatat() relative
        # to it rather than a lookup of the whole path again.
        if gone := self._gone():
            raise gone
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise self._gone() or StorageError(f"listing {self.root} failed: it changed while listed") from None
        except OSError as exc:
            raise self._error("list", ".", exc) from exc
        try:
            # Names only, not a DirEntry each (a third of the listing's time at 100k files): the stat every name gets
            # says what it is, without following a link or opening a FIFO, so what is not a regular file is told
            # apart there.
            names = os.listdir(fd)
            if suffixes:
                names = [name for name in names if name.endswith(suffixes)]
            flat = forked_half(partial(stat_names, fd), names, min_items=FORK_MIN_STATS, per_item=2)
        except OSError as exc:
            raise self._error("list", ".", exc) from exc
        finally:
            os.close(fd)
        sizes, mtimes = cast("list[int]", flat[0::2]), flat[1::2]  # sizes and modes are ints
        if min(sizes, default=0) < 0:  # FIFOs, links, folders named like ours; files deleted since the names were read
            for i, size in enumerate(sizes):
                if size == NOT_REGULAR and names[i].endswith(OBJECT_SUFFIXES):
                    self.skipped.add(names[i], not_regular_why(kind_of(int(mtimes[i]))))
        return [(name, size, mtime, None) for name, size, mtime in zip(names, sizes, mtimes, strict=True)
                if size >= 0 and not name.startswith(_TMP_PREFIX)]

    def _at(self, name: str) -> tuple[int | None, str]:
        """Where to find ``name`` without following a link under the root: (a descriptor of its folder, to close,
        and its last part), or (None, its whole path) for a name directly under the root."""
        check_name(name)
        slash = name.rfind("/")
        if slash < 0:
            return None, f"{self.root}/{name}"
        return open_dir(self.root, name[:slash].split("/")), name[slash + 1 :]

    # stat() and read_range() run once or twice per entry in a scan: plain try/except, no context manager.
    def stat(self, name: str) -> ObjectInfo | None:
        """The regular file ``name``; None if there is none, or if it is something else (counted as skipped)."""
        dir_fd = None
        try:
            dir_fd, leaf = self._at(name)
            st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            if absent(exc) or exc.errno == errno.ENOTDIR:
                self._check_root()
                return None
            if exc.errno == errno.ELOOP:  # a folder of the name is a link: not followed
                self.skipped.add(name, not_regular_why("reached through a symbolic link"))
                return None
            raise self._error("stat", name, exc) from exc
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        if not st_mode.S_ISREG(st.st_mode):
            self.skipped.add(name, not_regular_why(kind_of(st.st_mode)))
            return None
        return ObjectInfo(name, st.st_size, st.st_mtime)

    def read_range(self, name: str, offset: int, length: int) -> bytes | None:
        self.reads += 1
        fd = self._open_file("read", name)
        if fd is None:
            return None
        try:
            return os.pread(fd, length, offset)
        except OSError as exc:
            raise self._error("read", name, exc) from exc
        finally:
            os.close(fd)

    def read(self, name: str) -> bytes | None:
        self.reads += 1
        fd = self._open_file("read", name)
        if fd is None:
            return None
        with self._translate("read", name), open(fd, "rb") as f:
            return f.read()

    def read_with_info(self, name: str) -> tuple[bytes, ObjectInfo] | None:
        # The metadata of the very file read (fstat on its descriptor), taken before its bytes.
        self.reads += 1
        fd = self._open_file("read", name)
        if fd is None:
            return None
        with self._translate("read", name), open(fd, "rb") as f:
            st = os.fstat(fd)
            return f.read(), ObjectInfo(name, st.st_size, st.st_mtime)

    def read_chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes] | None:
        self.reads += 1
        fd = self._open_file("read", name)
        if fd is None:
            return None
        return self._chunks(open(fd, "rb"), name, chunk_bytes)  # noqa: SIM115 - the generator owns it from here

    def _chunks(self, f: BinaryIO, name: str, chunk_bytes: int) -> Iterator[bytes]:
        with f, self._translate("read", name):
            while chunk := f.read(chunk_bytes):
                yield chunk

    def delete(self, name: str, *, if_version: str | None = None) -> bool:
        # A directory has no versions (ObjectInfo.version is None here); JAX never rewrites a key, so there is nothing
        # to compare. unlink() removes
        # a link, never what it points to; the folders of a longer name are not followed either.
        with self._translate("delete", name):
            dir_fd, leaf = self._at(name)
            try:
                os.unlink(leaf, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno == errno.EISDIR:
                    raise self._not_regular(name, "a directory") from None
                if not (absent(exc) or exc.errno == errno.ENOTDIR):
                    raise
                self._check_root()
                return False
            finally:
                if dir_fd is not None:
                    os.close(dir_fd)
        return True

    def version_token(self, info: ObjectInfo) -> str:
        """A directory has no versions: the token is the object's size and mtime, which :meth:`write_atomic` compares
        (:func:`same_stat`) with the object's when it replaces it."""
        return f"{_TOKEN_PREFIX}{info.size_bytes}:{info.mtime_s!r}"

    def write_atomic(self, name: str, data: bytes, *, create_only: bool = False, if_version: str | None = None) -> None:
        """A new file renamed over the old one (readers see either). With ``if_version``, the rename happens under an
        exclusive lock (flock) on the file it replaces, once the path is seen to still name that locked file and its
        size and mtime to be those of the token: conditional writers of one object take turns, and each makes a file
        whose size or mtime differs from the one it replaced (its mtime moved on past the old one where a coarse
        clock left them equal), so a token never matches a later version. A replacement without ``if_version``
        (or a delete) does not wait for the lock."""
        expected = None if if_version is None else self._token_stat(name, if_version)
        if create_only and expected is not None:
            raise InvalidInputError("create_only and if_version exclude each other: a create has no earlier version")
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
                elif expected is not None:
                    self._replace_if(name, path, tmp, expected)
                else:
                    os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _token_stat(self, name: str, token: str) -> Stat:
        size, sep, mtime = token.removeprefix(_TOKEN_PREFIX).partition(":")
        try:
            if not (token.startswith(_TOKEN_PREFIX) and sep):
                raise ValueError(token)
            return int(size), float(mtime), None
        except ValueError:
            raise InvalidInputError(f"{token!r} is not a version token of {name!r} under {self.root} (see "
                                    "Storage.version_token)") from None

    def _replace_if(self, name: str, path: str, tmp: str, expected: Stat) -> None:
        """Rename ``tmp`` over ``path`` if the file there is still the version ``expected`` (see write_atomic)."""
        import fcntl

        changed = f"replace {name!r} under {self.root}: the object was replaced or deleted since it was read"
        while True:
            try:
                # For writing where allowed: on NFS, flock is a lock over the protocol that needs a file open for
                # writing to be exclusive. O_NOFOLLOW and O_NONBLOCK: never a link, never a wait on a FIFO.
                try:
                    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                except PermissionError:
                    fd = os.open(path, READ_FLAGS)
            except OSError as exc:
                if absent(exc) or exc.errno == errno.ENOTDIR:
                    raise PreconditionFailedError(changed) from None
                if exc.errno in NOT_REGULAR_ERRNOS or exc.errno == errno.EISDIR:
                    kind = {errno.ENXIO: "a socket", errno.EISDIR: "a directory"}.get(exc.errno, "a symbolic link")
                    raise self._not_regular(name, kind) from None
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                try:
                    there = os.stat(path, follow_symlinks=False)
                except FileNotFoundError:
                    raise PreconditionFailedError(changed) from None
                if (there.st_dev, there.st_ino) != (held.st_dev, held.st_ino):
                    continue  # replaced while this waited for the lock: judge the file there now
                if not st_mode.S_ISREG(held.st_mode):
                    raise self._not_regular(name, kind_of(held.st_mode))
                if not same_stat((held.st_size, held.st_mtime, None), expected):
                    raise PreconditionFailedError(changed)
                _move_past(tmp, held)
                os.replace(tmp, path)
                return
            finally:
                os.close(fd)  # releases the lock, after the rename


def _move_past(tmp: str, old: os.stat_result) -> None:
    """Give the file ``tmp`` an mtime other than ``old``'s where their sizes are equal: a file system's clock ticks
    in steps (the kernel's coarse clock, whole seconds on some), and a version must never read as the one it
    replaced. The step is the smallest this file system keeps."""
    new = os.stat(tmp)
    for step_ns in (1_000, 1_000_000, 1_000_000_000, 2_000_000_000):
        if new.st_size != old.st_size or new.st_mtime != old.st_mtime:
            return
        os.utime(tmp, ns=(new.st_atime_ns, old.st_mtime_ns + step_ns))
        new = os.stat(tmp)
