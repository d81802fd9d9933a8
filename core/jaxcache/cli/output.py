"""What every subcommand prints the same way: progress on a terminal, JSON on stdout, option parsing errors."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, TypeVar

import msgspec

from jaxcache.errors import InvalidInputError
from jaxcache.numbers import parse_int
from jaxcache.storage import ROOT_FORMS

T = TypeVar("T")

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2
ROOT_HELP = f"cache root: {ROOT_FORMS}"


def progress(items: Iterable[T], what: str) -> Iterator[T]:
    """Count records on stderr while a long scan runs; silent unless stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=what, unit=" entries", leave=False, file=sys.stderr, mininterval=0.2)


def json_text(data: Any) -> bytes:
    """``data`` as ``--json`` prints it: indented by one space, and a newline."""
    # msgspec, not json: `ls --json` of a large root is tens of MB, which json's indenting encoder (pure Python)
    # takes seconds over. Same layout; non-ASCII text is written as UTF-8 rather than as \u escapes.
    return msgspec.json.format(msgspec.json.encode(data), indent=1) + b"\n"


def write_out(text: bytes) -> None:
    """``text`` (UTF-8) on stdout, as it is."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stream (a test's StringIO)
        sys.stdout.write(text.decode())
        return
    sys.stdout.flush()
    out.write(text)
    out.flush()


def send_out(f: BinaryIO) -> None:
    """The rest of ``f`` on stdout; copied by the kernel where stdout is a file or pipe (a kept ``ls --json``
    answer is tens of MB)."""
    fileno = getattr(sys.stdout, "fileno", None)
    sys.stdout.flush()
    try:
        out = fileno() if fileno is not None else None
    except (OSError, ValueError):  # io.UnsupportedOperation is both: a test's StringIO
        out = None
    if out is not None:
        try:
            offset = f.tell()
            while sent := os.sendfile(out, f.fileno(), offset, 1 << 30):
                offset += sent
            return
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS):  # no sendfile to this kind of stdout: copy below
                raise
            f.seek(offset)
    write_out(f.read())


def json_name(name: str) -> str:
    """A name for JSON: as it is, unless it is not UTF-8 (a local file name's undecodable bytes), which JSON cannot
    carry: then as :func:`jaxcache.display.shown` writes it."""
    if name.isascii():
        return name
    try:
        name.encode()
    except UnicodeEncodeError:
        from jaxcache.display import shown

        return shown(name)
    return name


def print_json(data: Any) -> None:
    """One JSON document on stdout (``--json``), indented by one space."""
    write_out(json_text(data))


def flag_value(flag: str, parse: Callable[[str], T], text: str | None) -> T | None:
    """Parse one option's text, naming the option in the one-line error."""
    if text is None:
        return None
    try:
        return parse(text)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{flag}: {exc}") from None


#: Recorded names offered when none is close to the one asked for.
_LISTED = 5


def not_recorded(flag: str, value: str, named: Iterable[str], what: str, url: str) -> str:
    """The one line for a job or run that no record of ``url`` names: the close ones (difflib's), else a few of those
    recorded. ``explain --job`` and ``bundle export --job`` say it alike."""
    import difflib

    from jaxcache.display import shown

    named = set(named)
    close = difflib.get_close_matches(value, named, n=3)
    if close:
        hint = "did you mean " + " or ".join(repr(shown(c)) for c in close) + "?"
    elif named:
        few = sorted(named)[:_LISTED]
        more = f" and {len(named) - _LISTED} more" if len(named) > _LISTED else ""
        hint = f"{what}s recorded: " + ", ".join(shown(n) for n in few) + more
    else:
        hint = "the root holds no run or warm-up records"
    return f"{flag} {shown(value)!r}: no run or warm-up record in {url} names that {what}; {hint}"


def as_argument(parse: Callable[..., T], text: str, **limits: Any) -> T:
    """``parse(text, **limits)`` (a parser of :mod:`jaxcache.numbers`) for an argparse type: its one line, which
    argparse prefixes with the flag, exit 2."""
    try:
        return parse(text, **limits)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative(text: str) -> int:
    """An argparse type: a whole number >= 0, in ASCII digits of bounded length."""
    return as_argument(parse_int, text, least=0)
