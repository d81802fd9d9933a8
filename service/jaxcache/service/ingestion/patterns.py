"""The regular expressions a run record's keys must match, checked for a whole record at once.

msgspec matches a field's ``pattern`` with Python's ``re``, once per key and field: for a final record of 200 keys
that was two thirds of decoding it. :func:`unpatterned` gives a struct's fields without the patterns this module
knows a whole-record check for; a record decoded that way is exactly what the strict types accept when every check
passes. A check may refuse what the pattern allows (a key with a trailing newline, which ``$`` lets through): the
caller then decodes the record again with the strict types, which accept it or say what is wrong, and where.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Sequence
from operator import attrgetter, itemgetter, or_
from typing import Any

import msgspec

_NO_NUL = r"^[^\x00]*$"
_KEY = r"^[^/\x00]+-[0-9a-f]{64}$"
_HEX64 = r"^[0-9a-f]{64}$"
# Every other constraint and annotation a Meta holds, kept as it was.
_META = tuple(n for n in dir(msgspec.Meta) if not n.startswith("_") and n != "pattern")


def _hex(text: str) -> bool:
    """Only lower-case hex digits, an even number of them."""
    try:
        return bytes.fromhex(text).hex() == text  # fromhex skips spaces and takes upper case: the round trip does not
    except ValueError:
        return False


def _no_nul(values: Sequence[str]) -> bool:
    return "\x00" not in "".join(values)


def _hex64(values: Sequence[str]) -> bool:
    return all(len(v) == 64 for v in values) and _hex("".join(values))


_DASH, _HEADS, _TAILS = itemgetter(-65), itemgetter(slice(None, -65)), itemgetter(slice(-64, None))


def _keys(values: Sequence[str]) -> bool:
    """``<module>-<64 hex>``, the module's name not empty and without ``/`` or NUL."""
    if not values:
        return True
    if min(map(len, values)) <= 65 or "".join(map(_DASH, values)) != "-" * len(values):
        return False
    heads = "".join(map(_HEADS, values))
    return "/" not in heads and "\x00" not in heads and _hex("".join(map(_TAILS, values)))


CHECKS: dict[str, Callable[[Sequence[str]], bool]] = {_NO_NUL: _no_nul, _KEY: _keys, _HEX64: _hex64}

Checks = list[tuple[str, Callable[[Sequence[str]], bool]]]


def unpatterned(struct: type) -> tuple[dict[str, Any], Checks]:
    """Types of ``struct``'s fields without the patterns :data:`CHECKS` checks, and each such field's check."""
    types: dict[str, Any] = {}
    checks: Checks = []
    for name, hint in typing.get_type_hints(struct, include_extras=True).items():
        found: list[str] = []
        lax = _without(hint, found)
        if found:
            types[name] = lax
            checks += [(name, CHECKS[p]) for p in found]
    return types, checks


def _without(hint: Any, found: list[str]) -> Any:
    """``hint`` without the known patterns of its ``Annotated`` metadata (each listed in ``found``)."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *metas = typing.get_args(hint)
        kept = []
        for meta in metas:
            if isinstance(meta, msgspec.Meta) and meta.pattern in CHECKS:
                found.append(meta.pattern)
                meta = msgspec.Meta(**{n: getattr(meta, n) for n in _META if getattr(meta, n) is not None})
            kept.append(meta)
        return typing.Annotated[(base, *kept)]
    if typing.get_origin(hint) in (typing.Union, type(int | None)):
        return functools.reduce(or_, [_without(arm, found) for arm in typing.get_args(hint)])
    return hint


def all_match(keys: Sequence[Any], checks: Checks) -> bool:
    """Whether every key's fields pass their checks (a None is no text to check)."""
    for name, check in checks:
        values = list(map(attrgetter(name), keys))
        if None in values:
            values = [v for v in values if v is not None]
        if not check(values):
            return False
    return True
