"""What every subcommand prints the same way: progress on a terminal, JSON on stdout, option parsing errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import msgspec

from jaxcache.errors import InvalidInputError

T = TypeVar("T")

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2
ROOT_HELP = "cache root: a directory, file:///path, or gs://bucket/prefix"


def progress(items: Iterable[T], what: str) -> Iterator[T]:
    """Count records on stderr while a long scan runs; silent unless stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=what, unit=" entries", leave=False, file=sys.stderr, mininterval=0.2)


def print_json(data: Any) -> None:
    """One JSON document on stdout (``--json``), indented by one space."""
    # msgspec, not json: `ls --json` of a large root is tens of MB, which json's indenting encoder (pure Python)
    # takes seconds over. Same layout; non-ASCII text is written as UTF-8 rather than as \u escapes.
    text = msgspec.json.format(msgspec.json.encode(data), indent=1)
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stream (a test's StringIO)
        sys.stdout.write(text.decode() + "\n")
        return
    sys.stdout.flush()
    out.write(text + b"\n")
    out.flush()


def flag_value(flag: str, parse: Callable[[str], T], text: str | None) -> T | None:
    """Parse one option's text, naming the option in the one-line error."""
    if text is None:
        return None
    try:
        return parse(text)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{flag}: {exc}") from None


def non_negative(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value
