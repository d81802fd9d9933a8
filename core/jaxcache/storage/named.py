"""Paths a user names (a cache root, a tier, a key, a targets file, a bundle), judged as spelled before anything
resolves them, and files read through them without blocking and within a bound.

Resolving first (``realpath``) would hide the links on the way: a link another local user owns can be re-pointed
after any check. :func:`walk` follows a path as the kernel does, component by component from a descriptor of each
folder, and says what it went through; :func:`open_named` opens the very file it judged.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from jaxcache.display import shown
from jaxcache.errors import InvalidInputError
from jaxcache.storage.files import NOT_REGULAR_ERRNOS, READ_FLAGS, absent, kind_of

#: As Linux: a path that follows more links than this is a loop, not a place.
MAX_LINKS = 40
# A folder on the way is opened only to look names up in it: O_PATH needs no read permission on it (a 0711 home).
_SEARCH = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Step:
    """One thing a path went through: its path (as reached) and its ``lstat``."""

    path: str
    st: os.stat_result


@dataclass(slots=True)
class Walk:
    """What resolving a path went through: every link followed, every folder a name was looked up in (each once,
    first met first), and what it names (None when that is not there yet, or ``error`` stopped the walk)."""

    links: list[Step] = field(default_factory=list)
    dirs: list[Step] = field(default_factory=list)
    target: Step | None = None
    error: str | None = None
    # With keep_parent: a descriptor of the folder that holds the target, and the target's name in it.
    parent_fd: int | None = None
    name: str = ""

    def close(self) -> None:
        if self.parent_fd is not None:
            os.close(self.parent_fd)
            self.parent_fd = None


def spelled(path: str | os.PathLike[str]) -> str:
    """``path`` made absolute (``~`` expanded, the working folder before a relative one) and nothing else: no link
    resolved, no ``..`` folded, so a walk sees what the user named."""
    text = os.path.expanduser(os.fspath(path))
    return text if os.path.isabs(text) else os.path.join(os.getcwd(), text)


def walk(path: str, *, keep_parent: bool = False) -> Walk:
    """Follow the absolute ``path`` as the kernel resolves it, links included, and say what it went through."""
    found = Walk()
    stack = [("/", os.open("/", _SEARCH), os.lstat("/"))]  # the folders the path is in so far: (path, fd, stat)
    looked_in: set[str] = set()
    todo = path.split("/")[::-1]
    try:
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[1])
                continue
            here, fd, st_here = stack[-1]
            if here not in looked_in:
                looked_in.add(here)
                found.dirs.append(Step(here, st_here))
            there = f"/{part}" if here == "/" else f"{here}/{part}"
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                if not absent(exc):
                    found.error = f"cannot inspect {there}: {exc.strerror}"
                break  # not there (yet): nothing further on the way is either
            if stat.S_ISLNK(st.st_mode):
                found.links.append(Step(there, st))
                if len(found.links) > MAX_LINKS:
                    found.error = f"{path} goes through more than {MAX_LINKS} symbolic links"
                    break
                target = os.readlink(part, dir_fd=fd)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[1])
                todo.extend(target.split("/")[::-1])
                continue
            if all(p in ("", ".") for p in todo):  # the last part: what the path names
                found.target = Step(there, st)
                if keep_parent:
                    found.parent_fd, found.name = os.dup(fd), part
                break
            if not stat.S_ISDIR(st.st_mode):
                kind = "a file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
                found.error = f"{there} is {kind}, not a folder"
                break
            try:
                stack.append((there, os.open(part, _SEARCH, dir_fd=fd), st))
            except OSError as exc:  # replaced by a link or a file since its stat
                found.error = f"cannot inspect {there}: {exc.strerror}"
                break
        else:
            found.target = Step(stack[-1][0], stack[-1][2])  # "/", or a path that ends in "..": a folder
    finally:
        for _, fd, _ in stack:
            os.close(fd)
    return found


def link_problem(step: Step, me: int) -> str | None:
    """Why a link on a path cannot be taken: whoever owns it can re-point it after any check. Root's and this
    user's are taken."""
    if step.st.st_uid in (0, me):
        return None
    return f"{step.path} is a symbolic link owned by uid {step.st.st_uid}, not by you (uid {me}) or root"


def links_problems(found: Walk) -> list[str]:
    """The links on a walked path that another user owns, and why the walk stopped short if it did."""
    me = os.geteuid()
    out = [p for step in found.links if (p := link_problem(step, me)) is not None]
    return out + ([found.error] if found.error else [])


def check_named(path: str | os.PathLike[str], what: str) -> None:
    """Refuse, in one line, a path the user named (``what`` says which: ``--out``) that goes through a link another
    user owns: for a file about to be written, judged before anything is made through it."""
    found = walk(spelled(path))
    problems = links_problems(found)
    if problems:
        raise InvalidInputError(f"{what} {shown(os.fspath(path))}: {problems[0]}: not followed")


def open_named(path: str | os.PathLike[str], what: str) -> int:
    """A descriptor of the regular file a user named, read-only: the path judged as spelled (a link another user
    owns is refused), the file opened from the folder judged, without following a link or waiting on a FIFO.
    Raises :class:`InvalidInputError` in one line naming ``what`` (``--targets``) and the path."""
    said = f"{what} {shown(os.fspath(path))}"
    found = walk(spelled(path), keep_parent=True)
    try:
        problems = links_problems(found)
        if problems:
            raise InvalidInputError(f"{said}: {problems[0]}: not followed")
        if found.target is None:
            raise InvalidInputError(f"cannot read {said}: no such file")
        if not stat.S_ISREG(found.target.st.st_mode) or found.parent_fd is None:
            raise InvalidInputError(f"{said} is {kind_of(found.target.st.st_mode)}, not a regular file")
        try:
            fd = os.open(found.name, READ_FLAGS, dir_fd=found.parent_fd)
        except OSError as exc:
            why = "changed while it was opened" if exc.errno in NOT_REGULAR_ERRNOS else exc.strerror
            raise InvalidInputError(f"cannot read {said}: {why}") from None
    finally:
        found.close()
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # swapped for a FIFO since its stat: never read
        os.close(fd)
        raise InvalidInputError(f"{said} is {kind_of(mode)}, not a regular file")
    return fd


def read_named(path: str | os.PathLike[str], what: str, most: int, *,
               check: Callable[[int, os.stat_result], str | None] | None = None) -> bytes:
    """The whole of a regular file a user named (:func:`open_named`), at most ``most`` bytes (a larger one is
    refused, read no further). ``check``: why the open file (its descriptor and ``fstat``) may not be read, or None."""
    said = f"{what} {shown(os.fspath(path))}"
    fd = open_named(path, what)
    try:
        st = os.fstat(fd)
        problem = check(fd, st) if check is not None else None
        if problem is not None:
            raise InvalidInputError(f"{said} {problem}")
        if st.st_size > most:
            raise InvalidInputError(f"{said} is {st.st_size} bytes, more than the {most} it may be")
        chunks, left = [], most + 1
        while left and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise InvalidInputError(f"cannot read {said}: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > most:  # grew since its fstat
        raise InvalidInputError(f"{said} is more than the {most} bytes it may be")
    return data
