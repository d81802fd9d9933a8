"""The API's string and number rules, declared in OpenAPI and enforced as declared (ASCII classes only, each a subset
of the core's parsers), and the answers several parts of it share (errors, health, a miss's cause, digest
conflicts)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, PlainValidator, WithJsonSchema

from jaxcache.storage import ABSOLUTE_ROOT_PATTERN
from jaxcache.units import no_unit

#: What ``str.strip()`` removes (every character ``str.isspace()`` holds): a blank glob is refused by the core.
_BLANK = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
#: JAX's ``<module>-<64 hex>``; no ``/``, NUL or backslash, which no file name or storage accepts.
KEY = r"^[^/\\\x00]*-[0-9a-f]{64}$"
#: ``jaxcache.units.parse_duration``: a number with s, m, h, d or w; without a unit only 0.
DURATION = r"^ *([0-9]+(\.[0-9]+)? *[smhdwSMHDW]|0+(\.0+)?) *$"
#: ``jaxcache.units.parse_bytes``: bytes, or a number with B, k/kB, M/MB, ..., KiB, MiB, GiB or TiB.
SIZE = r"^ *[0-9]+(\.[0-9]+)? *([bB]|[kKmMgGtT]([iI]?[bB])?)? *$"
#: A glob over keys or function names: not blank, no NUL.
GLOB = rf"^[^\x00]*[^\x00{_BLANK}][^\x00]*$"
#: A pin is a glob that is also one path segment.
PIN = rf"^[^/\x00]*[^/\x00{_BLANK}][^/\x00]*$"
#: The listing's ``function`` filter: ``*`` and ``?`` (the catalog's SQLite GLOB would read ``[`` as a set).
FUNCTION_GLOB = r"^[^\x00\[]*$"
#: Free text compared in the catalog (PostgreSQL stores no NUL).
TEXT = r"^[^\x00]*$"
#: A cache root as a job spells it: an absolute directory, a file:// URL of one, or an object store's URL.
CACHE_DIR = ABSOLUTE_ROOT_PATTERN
#: ``<value>~<key in base64url>`` (``entries/route.py``); 18 digits keep a value within the catalog's bound, 2**62.
CURSOR = r"^((-?[0-9]{1,18}(\.[0-9]+)?)?~([A-Za-z0-9_-]{4})*([A-Za-z0-9_-]{2,3})?)?$"
#: jaxcache.explain.CAUSES, in the order they are decided (a test checks the two agree): a miss's cause, as the
#: jobs' pages and a cache's statistics show it.
Cause = Literal["skipped", "evicted", "unreadable", "not_written", "new_program", "unstable_program",
                "program_changed", "jaxlib", "backend", "xla_flags", "compile_options", "devices", "compression",
                "custom_hook", "unknown"]
CAUSE_HELP = (
    "why the cache did not give the program: skipped (the job's verify mode refused the entry; fix says why and what"
    " removes it), evicted (deleted: the prune or DELETE is named in fix), unreadable "
    "(the entry is there but cannot be loaded), not_written (an earlier run compiled it and JAX did not store it), "
    "new_program (the first time this cache sees the function), unstable_program (the same job's program differs "
    "every run), program_changed (the function changed: its signature or body), or the part of the key that "
    "differs from the nearest key of the function (jaxlib, backend, xla_flags, compile_options, devices, "
    "compression, custom_hook); unknown when nothing recorded tells"
)
#: Seconds saved, as every answer that sums them says it (jaxcache.usage_rules.credited_measure).
SAVED_HELP = (
    "saved s: compile seconds jobs' hits saved: each hit credited with its program's compile seconds as a job measured"
    " them on the key's own platform (platform compile s), else as its first writer measured them on its machine"
    " (writer's compile s), else JAX's stored whole seconds (stored compile s), less the seconds it took loading")
SAVED_WRITER_HELP = (
    "saved s at the writer's time: the part of saved_s credited with the writer's time (writer's or stored compile"
    " s), for keys no job has compiled yet: a warm-up's machine may compile much slower or faster than the job's")
#: Fits the catalog's signed 64-bit column with room to add, and a double holds it exactly.
MAX_BYTES = 10**18
_TEXT_MAX = 32
_MAX_FLOAT = sys.float_info.max


def _integral(value: Any) -> Any:
    # JSON Schema counts 3.0 as an integer, and so do clients that hold every number as a double.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def matcher(pattern: str, complaint: Callable[[str], str], max_length: int | None = None) -> Callable[[str], str]:
    """A ``pattern`` check raising ValueError with ``complaint``'s words, which the dashboard shows (not a regex)."""
    compiled = re.compile(pattern.removesuffix("$") + r"\Z")  # Python's `$` also matches before a final newline

    def check(value: str) -> str:
        if (max_length is not None and len(value) > max_length) or not compiled.match(value):
            raise ValueError(complaint(value))
        return value

    return check


def _not_a_duration(value: str) -> str:
    number = value.strip(" ")
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", number):  # DURATION without its unit
        return str(no_unit(number))  # the core's words (units.parse_duration): which unit to write
    return f"{value!r} is not a duration: use a number with s, m, h, d or w, like 14d"


_duration_text = matcher(DURATION, _not_a_duration, _TEXT_MAX)
_size_text = matcher(SIZE, lambda v: f"{v!r} is not a size: use a number with an optional unit, like 500MiB or 50GB",
                     _TEXT_MAX)
_glob = matcher(GLOB, lambda v: f"{v!r} is not a glob: give one like 'jit_train*' (not blank, no NUL)")


# One validator for a whole field: a union's errors would name each branch, and the dashboard shows them.
def _duration_or_zero(value: Any) -> float | str | None:
    if value is None or isinstance(value, str):
        return value if value is None else _duration_text(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a duration like '14d'")
    if value == 0:
        return 0.0
    if not 0 < value <= _MAX_FLOAT:  # also NaN, and JSON integers too long for a float
        raise ValueError(f"{value!r} is not a duration of 0 or more, like '14d'")
    # `14` reads as days as well as seconds: only 0 is the same in every unit.
    raise ValueError(str(no_unit(str(int(value)) if float(value).is_integer() else repr(float(value)))))


def _bytes_or_size(value: Any) -> int | str | None:
    if value is None or isinstance(value, str):
        return value if value is None else _size_text(value)
    value = _integral(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is neither a whole number of bytes nor a size like '50GiB'")
    if not 0 <= value <= MAX_BYTES:
        raise ValueError(f"{value!r} is not between 0 and {MAX_BYTES} bytes")
    return value


#: A duration such as ``14d`` (a number only when 0); null for none.
Duration = Annotated[float | str | None, PlainValidator(_duration_or_zero), WithJsonSchema({"anyOf": [
    {"type": "number", "const": 0},
    {"type": "string", "pattern": DURATION, "maxLength": _TEXT_MAX, "examples": ["14d"]}, {"type": "null"}]})]
#: Bytes (a whole number) or a size such as ``50GiB``; null for none.
Size = Annotated[int | str | None, PlainValidator(_bytes_or_size), WithJsonSchema({"anyOf": [
    {"type": "integer", "minimum": 0, "maximum": MAX_BYTES},
    {"type": "string", "pattern": SIZE, "maxLength": _TEXT_MAX, "examples": ["50GiB"]}, {"type": "null"}]})]
#: Put after an int's constraints: a strict model takes no strings or booleans, but 3.0 is 3.
integral = BeforeValidator(_integral)
DurationText = Annotated[str, AfterValidator(_duration_text),
                         Field(json_schema_extra={"pattern": DURATION, "maxLength": _TEXT_MAX}, examples=["14d"])]
Glob = Annotated[str, AfterValidator(_glob), Field(json_schema_extra={"pattern": GLOB})]
LoopHealthName = Literal["ok", "failing", "stuck"]


class LoopModel(BaseModel):
    """A background loop: when it last finished a round without error, its last error, rounds failed in a row, and
    how it is doing now (a stuck or failing loop never makes the replica unready)."""

    last_success_s: float | None = None
    last_error: str | None = None
    last_error_s: float | None = None
    failures: int = 0
    state: LoopHealthName = Field("ok", description="stuck: the pass running now has run past stuck_after_s (a "
                                  "verification: since its last batch); failing: its last round failed; else ok")
    running_since_s: float | None = Field(None, description="when the pass running now started; null between "
                                          "passes")
    running_cache: str | None = Field(None, description="the cache the running pass is on")
    stuck_after_s: float | None = Field(None, description="how long a pass may run before it is stuck "
                                        "(JAXCACHE_STUCK_AFTER_S, else 3 periods and at least 600 s)")
    caches: dict[str, LoopHealthName] = Field(
        default_factory=dict, description="each cache: stuck (the running pass is blocked on it), failing (its "
        "part of the last round failed) or ok")


class Health(BaseModel):
    status: str
    detail: dict[str, str] = Field(default_factory=dict)


class Readiness(Health):
    loops: dict[str, LoopModel] = Field(default_factory=dict, description="background loops (rescan, verify)")


class ErrorModel(BaseModel):
    detail: str


class ValidationProblem(BaseModel):
    """One problem FastAPI found in a request (its own 422 answers list them)."""

    loc: list[str | int] = Field(description="where: query, path or body, then the field",
                                 examples=[["query", "limit"]])
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class UnprocessableModel(BaseModel):
    """A 422: a list when the request does not match the schema, a string when a route refuses what it read."""

    detail: str | list[ValidationProblem]


class OtherDigest(BaseModel):
    sha256: str
    writer: str
    source: str = Field(description="reported or file: how the unsigned digest reached the service")
    record: str | None = Field(None, description="the record file it was read from")
    seen_s: float


class DigestConflict(BaseModel):
    """An entry for which writers recorded different digests: the one that counts, and the others."""

    key: str
    sha256: str = Field(description="the digest the entry is judged against")
    writer: str
    source: str
    others: list[OtherDigest]
