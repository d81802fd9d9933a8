"""Run records: what one process of a job did with the cache, written by the client, read by the service.

JAX's cache key is one-way: which job, topology and versions produced an entry cannot be read back from the file.
So every process that enables the cache through :mod:`jaxcache.client` writes a JSON record under
``<root>/.jaxcache/runs/<YYYY-MM-DD>/<run_id>-p<process_index>.json``: its fingerprint and, per key, whether it
hit, wrote, or compiled without writing (and why). The service ingests the same JSON from a rescan or from
``POST /v1/reports``. A record is rewritten in place as the process runs (counts are totals so far, never
increments), so ingesting one twice changes nothing.

This module is the one definition of that format, shared by the writer and the readers.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from jaxcache.errors import InvalidInputError

SCHEMA = "jaxcache.run/1"
RECORDS_DIR = ".jaxcache"
RUNS_PREFIX = f"{RECORDS_DIR}/runs/"
MAX_RECORD_BYTES = 32 * 1024 * 1024  # a process touching ~100k keys; anything bigger is not ours

HIT = "hit"
WRITE = "write"
COMPILED = "compiled"  # compiled because the cache did not have it, and not written (reason says why)
EVENTS = (HIT, WRITE, COMPILED)

_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_JOB_RE = re.compile(r"[^\x00-\x1f/\\]{1,200}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# JAX's key shape, as jaxcache.entry parses file names (kept here so the client need not import the format code).
_KEY_RE = re.compile(r"[^/\x00]+-[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """Everything that enters JAX's cache keys besides the program, so two runs that miss each other compare."""

    jax: str
    jaxlib: str
    backend: str | None = None
    device_kind: str | None = None
    device_count: int | None = None
    local_device_count: int | None = None
    process_count: int | None = None
    compression: str | None = None  # "zstandard" or "zlib": the library name JAX hashes into keys
    xla_flags_digest: str | None = None
    xla_caches: str | None = None

    @property
    def digest(self) -> str:
        """A short stable hash of every field: equal digests mean the same key inputs besides the program."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        """Every field plus ``digest``: the fingerprint as records, the API and the CLI print it."""
        return {**asdict(self), "digest": self.digest}

    def differences(self, other: Fingerprint) -> dict[str, tuple[Any, Any]]:
        """Fields that differ, as ``{name: (mine, theirs)}``: why two runs' keys do not match."""
        return {
            f.name: (getattr(self, f.name), getattr(other, f.name))
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        }


@dataclass(slots=True)
class KeyUsage:
    """What one process did with one key. Counts and seconds are totals for the process so far."""

    key: str
    event: str  # the most informative event seen: write > compiled > hit
    function: str = ""
    hits: int = 0
    compiles: int = 0
    writes: int = 0
    reason: str | None = None  # why a compiled program was not written, as JAX says it
    compile_s: float | None = None  # measured by this process (JAX stores only whole seconds)
    retrieval_s: float = 0.0  # total seconds spent reading and loading it on hits
    saved_s: float = 0.0  # total compile seconds JAX says hits saved (its stored whole seconds minus retrieval)
    size_bytes: int | None = None
    first_at: float = 0.0
    last_at: float = 0.0
    sha256: str | None = None  # of the stored bytes, read back by the writer once JAX finished writing them


@dataclass(slots=True)
class RunRecord:
    """One process of one run of a job."""

    job: str
    run_id: str
    process_index: int
    process_count: int
    host: str
    started_at: float
    updated_at: float
    fingerprint: Fingerprint
    topology: str | None = None
    cache_dir: str | None = None  # the root as the job spelled it: lets the service tell which cache a report is for
    final: bool = False
    pid: int | None = None
    keys: list[KeyUsage] = field(default_factory=list)
    schema: str = SCHEMA

    @property
    def name(self) -> str:
        """The record's object name under the cache root."""
        return record_name(self.run_id, self.process_index, self.started_at)

    def to_json(self) -> bytes:
        """Serialize as the JSON the service accepts."""
        data = {**asdict(self), "fingerprint": self.fingerprint.as_dict()}
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def record_name(run_id: str, process_index: int, started_at: float) -> str:
    """``.jaxcache/runs/<UTC date of start>/<run_id>-p<index>.json``."""
    day = dt.datetime.fromtimestamp(started_at, dt.UTC).strftime("%Y-%m-%d")
    return f"{RUNS_PREFIX}{day}/{run_id}-p{process_index}.json"


def is_record_name(name: str) -> bool:
    """True for names shaped like a run record's."""
    return name.startswith(RUNS_PREFIX) and name.endswith(".json")


def check_run_id(run_id: str) -> str:
    """A run id becomes part of an object name: letters, digits, ``_``, ``.``, ``-``; at most 128 characters."""
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id):
        raise InvalidInputError(
            f"run id {run_id!r}: use 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return run_id


def check_job(job: str) -> str:
    """A job name is free text without control characters or slashes, 1-200 characters."""
    if not isinstance(job, str) or not _JOB_RE.fullmatch(job):
        raise InvalidInputError(f"job name {job!r}: use 1-200 printable characters without '/' or '\\'")
    return job


def parse(data: bytes | str | Mapping[str, Any]) -> RunRecord:
    """Parse and validate a run record. Raises :class:`InvalidInputError` saying what is wrong."""
    if isinstance(data, (bytes, str)):
        if len(data) > MAX_RECORD_BYTES:
            raise InvalidInputError(f"run record is larger than {MAX_RECORD_BYTES} bytes")
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"run record is not JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise InvalidInputError("run record must be a JSON object")
    if data.get("schema") != SCHEMA:
        raise InvalidInputError(f"run record schema {data.get('schema')!r} is not {SCHEMA!r}")
    fp = _obj(data, "fingerprint")
    fingerprint = Fingerprint(
        jax=_str(fp, "jax"),
        jaxlib=_str(fp, "jaxlib"),
        backend=_str(fp, "backend", optional=True),
        device_kind=_str(fp, "device_kind", optional=True),
        device_count=_int(fp, "device_count", optional=True),
        local_device_count=_int(fp, "local_device_count", optional=True),
        process_count=_int(fp, "process_count", optional=True),
        compression=_str(fp, "compression", optional=True),
        xla_flags_digest=_str(fp, "xla_flags_digest", optional=True),
        xla_caches=_str(fp, "xla_caches", optional=True),
    )
    raw_keys = data.get("keys", [])
    if not isinstance(raw_keys, list):
        raise InvalidInputError("run record 'keys' must be a list")
    keys = [_key_usage(k, i) for i, k in enumerate(raw_keys)]
    record = RunRecord(
        job=check_job(_str(data, "job")),
        run_id=check_run_id(_str(data, "run_id")),
        process_index=_int(data, "process_index"),
        process_count=_int(data, "process_count", minimum=1),
        host=_str(data, "host"),
        started_at=_num(data, "started_at"),
        updated_at=_num(data, "updated_at"),
        fingerprint=fingerprint,
        topology=_str(data, "topology", optional=True),
        cache_dir=_str(data, "cache_dir", optional=True),
        final=_bool(data, "final"),
        pid=_int(data, "pid", optional=True),
        keys=keys,
    )
    if record.process_index >= record.process_count:
        raise InvalidInputError(
            f"run record process_index {record.process_index} is not below process_count {record.process_count}"
        )
    return record


def _key_usage(raw: Any, i: int) -> KeyUsage:
    where = f"keys[{i}]"
    if not isinstance(raw, Mapping):
        raise InvalidInputError(f"run record {where} must be an object")
    key = _str(raw, "key", where=where)
    if not _KEY_RE.fullmatch(key):
        raise InvalidInputError(f"run record {where}.key {key!r} is not a JAX cache key (<module>-<64 hex>)")
    event = _str(raw, "event", where=where)
    if event not in EVENTS:
        raise InvalidInputError(f"run record {where}.event {event!r} is not one of {', '.join(EVENTS)}")
    compile_s = raw.get("compile_s")
    return KeyUsage(
        key=key,
        event=event,
        function=_str(raw, "function", where=where, optional=True) or key.rsplit("-", 1)[0],
        hits=_int(raw, "hits", where=where, optional=True) or 0,
        compiles=_int(raw, "compiles", where=where, optional=True) or 0,
        writes=_int(raw, "writes", where=where, optional=True) or 0,
        reason=_str(raw, "reason", where=where, optional=True),
        compile_s=None if compile_s is None else _num(raw, "compile_s", where=where),
        retrieval_s=_num(raw, "retrieval_s", where=where, optional=True) or 0.0,
        saved_s=_num(raw, "saved_s", where=where, optional=True, signed=True) or 0.0,
        size_bytes=_int(raw, "size_bytes", where=where, optional=True),
        first_at=_num(raw, "first_at", where=where, optional=True) or 0.0,
        last_at=_num(raw, "last_at", where=where, optional=True) or 0.0,
        sha256=_digest(raw, where),
    )


def _digest(raw: Mapping[str, Any], where: str) -> str | None:
    value = raw.get("sha256")
    if value is None:
        return None
    if not isinstance(value, str) or not _SHA256_RE.fullmatch(value):
        raise InvalidInputError(f"run record field {where}.sha256 must be 64 lower-case hex digits")
    return value


def _obj(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name)
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"run record field {name!r} must be an object")
    return value


def _str(data: Mapping[str, Any], name: str, *, where: str = "", optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > 1000:
        raise InvalidInputError(f"run record field {_at(where, name)} must be a string of at most 1000 characters")
    if "\x00" in value:  # no database stores text with NUL in it (PostgreSQL refuses it)
        raise InvalidInputError(f"run record field {_at(where, name)} must not contain NUL characters")
    return value


def _int(data: Mapping[str, Any], name: str, *, where: str = "", optional: bool = False, minimum: int = 0) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value < 2**53:
        raise InvalidInputError(f"run record field {_at(where, name)} must be an integer >= {minimum}")
    return value


def _num(
    data: Mapping[str, Any], name: str, *, where: str = "", optional: bool = False, signed: bool = False
) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (not signed and value < 0) or abs(value) > 1e12:
        raise InvalidInputError(f"run record field {_at(where, name)} must be a finite number")
    return float(value)


def _bool(data: Mapping[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise InvalidInputError(f"run record field {name!r} must be true or false")
    return value


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else repr(name)
