"""What a prune may delete: the policy, parsed and checked (user input in, :class:`PrunePolicy` out)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jaxcache.errors import InvalidInputError
from jaxcache.units import no_unit, parse_bytes, parse_duration

STALE_JAXLIB_WINDOW_S = 14 * 86400.0
#: Integrity classes a policy may select: the ones that are evidence of harm.
INTEGRITY_CLASSES = ("tampered", "mismatched", "differs", "corrupt")
#: The proven ones: what ``--integrity`` alone selects. ``differs`` (against an unsigned digest) proves nothing,
#: so it acts only where the operator names it.
PROOF_CLASSES = ("tampered", "mismatched", "corrupt")

@dataclass(frozen=True, slots=True)
class PrunePolicy:
    """What to delete. An entry goes if ANY selecting rule picks it and NO keep rule (pins, min_age) protects it.

    Selecting rules: ``max_total_bytes``, ``unused_for_s``, ``older_than_s``, ``functions``, ``corrupt``,
    ``orphans``, ``stale_jaxlib``. Keep rules: ``keep`` (pins) and ``min_age_s`` (a grace period for fresh entries).
    """

    max_total_bytes: int | None = None  # evict least recently used first until total <= this
    unused_for_s: float | None = None  # last use older than this
    older_than_s: float | None = None  # created longer ago than this
    functions: tuple[str, ...] = ()  # fnmatch globs over the function (module) name
    corrupt: bool = False  # entries whose status is "corrupt"
    orphans: bool = False  # orphaned -atime files
    keep: tuple[str, ...] = ()  # pins: exact keys or fnmatch globs over key OR function name
    min_age_s: float = 3600.0  # grace: never delete anything created (mtime) less than this ago
    # Entries whose writer's jaxlib no run used within the window: a jaxlib upgrade changes every key, so they can
    # never hit again. Needs run records (plan's ``recent_jaxlibs``); an entry with an unknown writer is never stale.
    stale_jaxlib: bool = False
    stale_jaxlib_window_s: float = STALE_JAXLIB_WINDOW_S
    # Integrity classes to remove ("tampered", "corrupt", "mismatched"): needs verdicts (Candidate.integrity).
    integrity: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # The service may build a policy directly: check it here too, not only in policy_from_mapping.
        if self.max_total_bytes is not None:
            _check_number("max_total_bytes", self.max_total_bytes, integer=True)
        for name in ("unused_for_s", "older_than_s"):
            value = getattr(self, name)
            if value is not None:
                _check_number(name, value)
        _check_number("min_age_s", self.min_age_s)
        _check_number("stale_jaxlib_window_s", self.stale_jaxlib_window_s)
        for name in ("functions", "keep"):
            object.__setattr__(self, name, _check_patterns(name, getattr(self, name)))
        for name in ("corrupt", "orphans", "stale_jaxlib"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInputError(f"prune policy {name} must be true or false, not {getattr(self, name)!r}")
        object.__setattr__(self, "integrity", _check_integrity(self.integrity))

    def selects_anything(self) -> bool:
        """False when no selecting rule is set (such a policy deletes nothing)."""
        return (
            self.max_total_bytes is not None
            or self.unused_for_s is not None
            or self.older_than_s is not None
            or bool(self.functions)
            or self.corrupt
            or self.orphans
            or self.stale_jaxlib
            or bool(self.integrity)
        )

    def as_dict(self) -> dict[str, Any]:
        """The policy with the field names of :func:`policy_from_mapping`, durations in seconds (for JSON)."""
        return {
            "max_total_bytes": self.max_total_bytes,
            "unused_for": self.unused_for_s,
            "older_than": self.older_than_s,
            "functions": list(self.functions),
            "corrupt": self.corrupt,
            "orphans": self.orphans,
            "keep": list(self.keep),
            "min_age": self.min_age_s,
            "stale_jaxlib": self.stale_jaxlib,
            "stale_jaxlib_window": self.stale_jaxlib_window_s,
            "integrity": list(self.integrity),
        }



def _check_integrity(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise InvalidInputError(f"prune policy integrity must be a list of classes, not {value!r}")
    bad = [v for v in value if v not in INTEGRITY_CLASSES]
    if bad:
        raise InvalidInputError(
            f"prune policy integrity: {', '.join(map(repr, bad))} cannot be selected; use any of "
            f"{', '.join(INTEGRITY_CLASSES)} (pending and unattested entries are not evidence of harm)"
        )
    return tuple(dict.fromkeys(value))


def _check_number(name: str, value: Any, *, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        what = "a whole number of bytes" if integer else "a number of seconds"
        raise InvalidInputError(f"prune policy {name} must be {what}, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"prune policy {name} must be 0 or more, not {value!r}")


def _check_patterns(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise InvalidInputError(f"prune policy {name} must be a list of patterns (strings), not {value!r}")
    if any(not p.strip() for p in value):
        raise InvalidInputError(f"prune policy {name} has an empty pattern: remove it or give a glob like 'jit_train*'")
    return tuple(dict.fromkeys(value))  # in order, without repeats


_FIELDS = (
    "max_total_bytes", "unused_for", "older_than", "functions", "corrupt", "orphans", "keep", "min_age",
    "stale_jaxlib", "stale_jaxlib_window", "integrity",
)


def policy_from_mapping(data: Mapping[str, Any]) -> PrunePolicy:
    """Build a policy from user input (JSON, YAML, a form), rejecting anything it does not understand.

    Fields: ``max_total_bytes`` (bytes or a size like ``"50GiB"``), ``unused_for``, ``older_than`` and
    ``min_age`` (a duration like ``"14d"``; a number only when 0), ``functions`` and ``keep`` (lists of globs; a single
    string is one glob), ``corrupt``, ``orphans`` and ``stale_jaxlib`` (booleans), ``stale_jaxlib_window`` (a
    duration, default 14d; only with ``stale_jaxlib``). Absent or null fields take their defaults.
    An unknown field is an error: a typo in a prune policy must not silently widen it.
    """
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"a prune policy must be a mapping of fields to values, not {type(data).__name__}")
    for key in data:
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), _FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidInputError(
                f"unknown prune policy field {key!r}{hint}; known fields: {', '.join(_FIELDS)}"
            )
    kwargs: dict[str, Any] = {}
    if data.get("max_total_bytes") is not None:
        kwargs["max_total_bytes"] = _size("max_total_bytes", data["max_total_bytes"])
    durations = (("unused_for", "unused_for_s"), ("older_than", "older_than_s"), ("min_age", "min_age_s"),
                 ("stale_jaxlib_window", "stale_jaxlib_window_s"))
    for key, attr in durations:
        if data.get(key) is not None:
            kwargs[attr] = _duration(key, data[key])
    for key in ("functions", "keep", "integrity"):
        if data.get(key) is not None:
            kwargs[key] = data[key]
    for key in ("corrupt", "orphans", "stale_jaxlib"):
        if data.get(key) is not None:
            if not isinstance(data[key], bool):
                raise InvalidInputError(f"prune policy field {key!r} must be true or false, not {data[key]!r}")
            kwargs[key] = data[key]
    if "stale_jaxlib_window_s" in kwargs and not kwargs.get("stale_jaxlib"):
        # A window alone selects nothing: most likely `stale_jaxlib: true` was forgotten.
        raise InvalidInputError("prune policy field 'stale_jaxlib_window' needs 'stale_jaxlib': true")
    return PrunePolicy(**kwargs)


def _size(key: str, value: Any) -> int:
    if isinstance(value, str):
        try:
            return parse_bytes(value)
        except InvalidInputError as exc:
            raise InvalidInputError(f"prune policy field {key!r}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(
            f"prune policy field {key!r} must be a whole number of bytes or a size like '50GiB', not {value!r}"
        )
    if value < 0:
        raise InvalidInputError(f"prune policy field {key!r} must be 0 or more, not {value}")
    return value


def _duration(key: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except InvalidInputError as exc:
            raise InvalidInputError(f"prune policy field {key!r}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"prune policy field {key!r} must be a duration like '14d' (a number only when 0), "
                                f"not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"prune policy field {key!r} must be 0 or more, like '14d', not {value!r}")
    if value != 0:
        # As for a flag (units.parse_duration): `"unused_for": 14` reads as days as well as seconds.
        number = str(int(value)) if float(value).is_integer() else repr(float(value))
        raise InvalidInputError(f"prune policy field {key!r}: {no_unit(number)}")
    return 0.0
