"""Numbers read from input (a flag, a variable, a file, a URL): ASCII digits of bounded length, or one line saying so.

Python's ``int()`` and ``float()`` take any script's digits (``int("٢")`` is 2), ``float()`` takes ``inf``, ``nan``
and ``1e999``, and ``int()`` of more than 4,300 digits ends in a traceback: every number from input goes through
:func:`parse_int` or :func:`parse_float`, which take ASCII only and look at no more than :data:`MAX_NUMBER_CHARS`.
"""

from __future__ import annotations

import math
import re

from jaxcache.display import excerpt
from jaxcache.errors import InvalidInputError

#: The longest number taken from input, sign, point and exponent included: 2**64 has 20 digits.
MAX_NUMBER_CHARS = 32
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def whole(text: str) -> int | None:
    """``text`` (blanks around it allowed) as a whole number when it is one in ASCII digits, an optional sign and at
    most :data:`MAX_NUMBER_CHARS` characters; else None, for a parser that words its own message."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or _INT.fullmatch(text) is None:
        return None
    return int(text)


def decimal(text: str) -> float | None:
    """``text`` as a finite number in ASCII (``2``, ``0.5``, ``1e3``), at most :data:`MAX_NUMBER_CHARS`
    characters; else None (``inf``, ``nan``, ``1e999``, other scripts' digits)."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or _FLOAT.fullmatch(text) is None:
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def _bounds(least: float | None, most: float | None, above: float | None = None) -> str:
    if above is not None:
        return f"more than {above:g}" + (f" and at most {most:g}" if most is not None else "")
    if least is not None and most is not None:
        return f"from {least:g} to {most:g}"
    if least is not None:
        return f"{least:g} or more"
    return f"{most:g} or less" if most is not None else ""


def _refused(text: str, what: str, number: str, unit: str, range_: str, hint: str) -> InvalidInputError:
    wanted = f"use {number}" + (f" of {unit}" if unit else "") + (f", {range_}" if range_ else "")
    return InvalidInputError(" ".join(filter(None, (what, f"{excerpt(text)}: {wanted}", hint))))


def parse_int(text: str, what: str = "", *, least: int | None = None, most: int | None = None, unit: str = "",
              hint: str = "") -> int:
    """A whole number from input, ``least`` <= it <= ``most``; raises :class:`InvalidInputError` in one line naming
    ``what`` (``JAXCACHE_PREFETCH``; argparse names a flag itself) and quoting at most the start of ``text``."""
    value = whole(text)
    if value is None or (least is not None and value < least) or (most is not None and value > most):
        raise _refused(text, what, "a whole number", unit, _bounds(least, most), hint)
    return value


def parse_float(text: str, what: str = "", *, least: float | None = None, most: float | None = None,
                above: float | None = None, unit: str = "", hint: str = "") -> float:
    """A finite number from input, ``least`` <= it <= ``most`` and > ``above``; raises :class:`InvalidInputError` in
    one line naming ``what`` and quoting at most the start of ``text``."""
    value = decimal(text)
    if (value is None or (least is not None and value < least) or (most is not None and value > most)
            or (above is not None and value <= above)):
        if above == 0:
            raise _refused(text, what, "a positive number", unit, _bounds(least, most), hint)
        raise _refused(text, what, "a number", unit, _bounds(least, most, above), hint)
    return value
