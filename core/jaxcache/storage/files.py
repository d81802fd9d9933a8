"""Opening what is under a local root so that nothing there can block a reader or lead it out of the root."""

from __future__ import annotations

import errno
import os
import stat as st_mode

# Every object is opened so that it cannot block the reader or lead it out of the root: O_NOFOLLOW (a link is not
# followed), O_NONBLOCK (opening a FIFO does not wait for a writer), then fstat must say it is a regular file.
# Folders on the way are opened the same way (O_NOFOLLOW each); only the root itself may be a link.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# The same for a small file written in place (created if need be): opening a FIFO for writing waits for a reader,
# and with O_NONBLOCK fails (ENXIO) instead.
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What opening something that is not a regular file fails with: a link under O_NOFOLLOW, a socket.
NOT_REGULAR_ERRNOS = frozenset({errno.ELOOP, errno.ENXIO})


def absent(exc: OSError) -> bool:
    """Whether ``exc`` says there is no such file."""
    # A name longer than the file system allows names no file: JAX could not have written it.
    return isinstance(exc, FileNotFoundError) or exc.errno == errno.ENAMETOOLONG


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, for a message (``a FIFO``)."""
    if st_mode.S_ISLNK(mode):
        return "a symbolic link"
    if st_mode.S_ISDIR(mode):
        return "a directory"
    if st_mode.S_ISFIFO(mode):
        return "a FIFO"
    if st_mode.S_ISSOCK(mode):
        return "a socket"
    if st_mode.S_ISCHR(mode) or st_mode.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def not_regular_why(kind: str) -> str:
    return f"{kind}, not a regular file"


#: What :func:`stat_names` gives as the size of a name deleted since it was listed, and of one that is not a regular
#: file (its ``st_mode`` then stands in for the mtime).
GONE, NOT_REGULAR = -1, -2


def stat_names(fd: int, names: list[str]) -> list[float]:
    """Size and mtime of each of ``names`` in the directory ``fd``, flat: ``[size, mtime, size, mtime, ...]``. Two
    plain numbers a name, not a tuple: a forked child's half of 100k comes back through a pipe as numbers, not as
    50k little arrays to rebuild (0.03 s). A name deleted since it was listed has size :data:`GONE`; one that is
    no longer a regular file (a FIFO, a link, a folder) has size :data:`NOT_REGULAR` and its ``st_mode``."""
    out: list[float] = []
    add, stat, is_reg = out.append, os.stat, st_mode.S_ISREG
    for name in names:
        try:
            st = stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            add(GONE)
            add(0)
            continue
        if is_reg(st.st_mode):
            add(st.st_size)
            add(st.st_mtime)
        else:
            add(NOT_REGULAR)
            add(st.st_mode)
    return out


def read_small(path: str, most: int) -> bytes | None:
    """Up to ``most`` + 1 bytes of the regular file ``path`` (a caller tells a longer one by its length), or None
    where there is none or it is something else: never through a link, never waiting on a FIFO."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        if absent(exc) or exc.errno in NOT_REGULAR_ERRNOS:
            return None
        raise
    try:
        return os.read(fd, most + 1) if st_mode.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def write_small(path: str, data: bytes) -> bool:
    """Write ``data`` as the whole of the file ``path`` in place (created if need be); False, writing nothing, where
    something other than a regular file has that name (a FIFO, a link, a folder): never waiting on a FIFO."""
    try:
        fd = os.open(path, WRITE_FLAGS, 0o666)
    except OSError as exc:
        if exc.errno in NOT_REGULAR_ERRNOS or exc.errno == errno.EISDIR:
            return False
        raise
    try:
        if not st_mode.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return True


def open_dir(root: str, parts: list[str]) -> int:
    """A descriptor of the folder ``parts`` under ``root``, each step opened without following a link (``root``
    itself may be one)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                inner = os.open(part, DIR_FLAGS, dir_fd=fd)
            except NotADirectoryError:  # what O_NOFOLLOW | O_DIRECTORY says of a link: tell it from a file
                if st_mode.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, "a symbolic link on the way, not followed", part) from None
                raise
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd
