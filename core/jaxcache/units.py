"""Human-readable sizes and durations, both ways, and counts with their nouns."""

from __future__ import annotations

import re

from jaxcache.display import excerpt
from jaxcache.errors import InvalidInputError
from jaxcache.numbers import decimal

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# ASCII digits ([0-9]: \d takes every script's); numbers.decimal bounds the number's length.
_NUMBER_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


def format_bytes(n: int | float) -> str:
    """``1536`` → ``1.5 KiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str) -> int:
    """``50GiB``, ``2.5 GB``, ``1000`` → bytes. Raises :class:`InvalidInputError` with the accepted forms."""
    m = _NUMBER_UNIT.fullmatch(text)
    unit = m.group(2).lower() if m else None
    value = decimal(m.group(1)) if m else None
    if m is None or unit not in _SIZE_UNITS or value is None:
        if _negative(text, _SIZE_UNITS):
            raise InvalidInputError(f"{excerpt(text)} is negative: a size is 0 or more, like 500MiB or 50GB")
        raise InvalidInputError(f"{excerpt(text)} is not a size: use a number with an optional unit, like 500MiB or"
                                " 50GB")
    return int(value * _SIZE_UNITS[unit])


def format_duration(seconds: float) -> str:
    """``90061`` → ``1d 1h``: the two largest units that are not zero (``86460`` → ``1d 1m``), for ages. Spelled
    out unit by unit: ``ls`` formats one per entry and column."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        m, r = divmod(s, 60)
        return f"{m}m {r}s" if r else f"{m}m"
    if s < 86400:
        h, r = divmod(s, 3600)
        if r >= 60:
            return f"{h}h {r // 60}m"
        return f"{h}h {r}s" if r else f"{h}h"
    d, r = divmod(s, 86400)
    if r >= 3600:
        return f"{d}d {r // 3600}h"
    if r >= 60:
        return f"{d}d {r // 60}m"
    return f"{d}d {r}s" if r else f"{d}d"


def _negative(text: str, units: dict[str, int]) -> bool:
    """Whether ``text`` is a minus sign before what would be a valid value (``-3d``): said as such, not as garbage."""
    m = _NUMBER_UNIT.fullmatch(text.strip().removeprefix("-")) if text.strip().startswith("-") else None
    return m is not None and m.group(2).lower() in units


def parse_duration(text: str) -> float:
    """``14d``, ``12h``, ``30m``, ``45s``, ``2w`` → seconds. A number without a unit is refused, 0 aside (zero is
    zero in every unit): ``--unused-for 14`` read as seconds would prune all but the last 14 s of use."""
    m = _NUMBER_UNIT.fullmatch(text)
    unit = m.group(2).lower() if m else None
    value = decimal(m.group(1)) if m else None
    if m is not None and unit == "" and value is not None:
        if value == 0:
            return 0.0
        raise no_unit(m.group(1))
    if m is None or unit not in _DURATION_UNITS or value is None:
        if _negative(text, _DURATION_UNITS):
            raise InvalidInputError(f"{excerpt(text)} is negative: a duration is 0 or more, like 14d")
        raise InvalidInputError(f"{excerpt(text)} is not a duration: use a number with s, m, h, d or w, like 14d")
    return value * _DURATION_UNITS[unit]


def no_unit(number: str) -> InvalidInputError:
    """The refusal of a duration given as a bare number (``14``), with the spellings to use (``14d``, ``14s``): which
    one was meant, no reader can tell."""
    n = number if decimal(number) is not None else "14"  # never a 5,000-digit example
    return InvalidInputError(f"{excerpt(number)} has no unit: write {n}d for days or {n}s for seconds (m, h and w: "
                             "minutes, hours and weeks)")


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``0 misses``: a count and its noun, plural unless the count is 1. ``nouns``: the
    plural where adding ``s`` (``es`` after s, x, ch, sh; ``ies`` for a consonant's ``y``) would be wrong."""
    if n == 1:
        return f"{n} {noun}"
    if nouns is None:
        if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
            nouns = noun[:-1] + "ies"
        else:
            nouns = noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")
    return f"{n} {nouns}"
