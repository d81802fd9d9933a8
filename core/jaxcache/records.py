"""Run records: what one process of a job did with the cache. The one schema of the format (``jaxcache.run/1``):
the client writes it, the service, the CLI and integrity checks read it, and the API's OpenAPI document shows it.

JAX's cache key is one-way: which job, topology and versions produced an entry cannot be read back from the file,
so each process writes ``<root>/.jaxcache/runs/<YYYY-MM-DD>/<run_id>-p<process_index>.json``. A record is
rewritten as the process runs (its counts are totals so far), so reading one twice changes nothing. Limits match
the catalog's columns, so a record that parses also fits the catalog.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import operator
import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import msgspec

from jaxcache.errors import InvalidInputError
from jaxcache.jsontree import map_leaves
from jaxcache.keyparts import KeyParts, ProgramSignature

SCHEMA = "jaxcache.run/1"
RECORDS_DIR = ".jaxcache"
RUNS_PREFIX = f"{RECORDS_DIR}/runs/"
MAX_RECORD_BYTES = 32 * 1024 * 1024  # a process touching ~100k keys; anything bigger is not ours

Event = Literal["hit", "write", "compiled"]
HIT: Final = "hit"
WRITE: Final = "write"
COMPILED: Final = "compiled"  # compiled because the cache did not have it, and not written (reason says why)
EVENTS: tuple[Event, ...] = (HIT, WRITE, COMPILED)

# What kind of process wrote a record. Only jobs' hits are use: a warm-up's own compiles and its verify run's hits
# would make hit rates, job lists, "hit since" and LRU prunes describe the tool instead of the jobs it serves.
RunKind = Literal["job", "warmup", "warmup-verify"]
JOB: Final = "job"
WARMUP: Final = "warmup"
WARMUP_VERIFY: Final = "warmup-verify"

_RUN_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
_JOB = r"[^\x00-\x1f/\\]{1,200}"

# Field types with their limits. No text holds NUL: PostgreSQL stores none.
Text = Annotated[str, msgspec.Meta(max_length=1000, pattern=r"^[^\x00]*$")]
ShortText = Annotated[str, msgspec.Meta(max_length=256, pattern=r"^[^\x00]*$")]
Count = Annotated[int, msgspec.Meta(ge=0, lt=2**53)]
ProcessIndex = Annotated[int, msgspec.Meta(ge=0, lt=2**31)]  # the catalog's 32-bit columns
# Durations and Unix times alike: a time must name a date (year below 10000), which record names are made of.
MAX_SECONDS = 253_402_300_799.0
Seconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
SignedSeconds = Annotated[float, msgspec.Meta(ge=-MAX_SECONDS, le=MAX_SECONDS)]
# JAX's key shape (<module>-<64 hex>), at most as long as the catalog's key column.
Key = Annotated[str, msgspec.Meta(max_length=512, pattern=r"^[^/\x00]+-[0-9a-f]{64}$")]
Sha256 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
RunId = Annotated[str, msgspec.Meta(pattern=f"^{_RUN_ID}$")]
Job = Annotated[str, msgspec.Meta(pattern=f"^{_JOB}$")]


# gc=False on the structs a record holds per key (and its fingerprint): they hold only strings, numbers and each
# other, so they can make no reference cycle, and a record of 200 keys would give the cycle collector 600 more
# objects to walk (9% of a service worker's time in a report storm).
class Fingerprint(msgspec.Struct, frozen=True, gc=False):
    """Everything that enters JAX's cache keys besides the program, so two runs that miss each other compare."""

    jax: Text
    jaxlib: Text
    backend: Text | None = None
    device_kind: Text | None = None
    device_count: Count | None = None
    local_device_count: Count | None = None
    process_count: Count | None = None
    compression: Text | None = None  # "zstandard" or "zlib": the library name JAX hashes into keys
    xla_flags_digest: Text | None = None
    xla_caches: Text | None = None
    python: Text | None = None  # the interpreter's version: which zstd library JAX uses, hence hashes, depends on it
    platform_version: Text | None = None  # the backend's version string, which JAX hashes ("backend" part)
    xla_flags: Annotated[tuple[Text, ...], msgspec.Meta(max_length=512)] | None = None  # the flags JAX hashed

    @property
    def digest(self) -> str:
        """A short stable hash of every known field: equal digests mean the same key inputs besides the program.
        Unknown (None) fields are left out, so a field added later leaves older fingerprints' digests as they were."""
        known = {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}
        text = json.dumps(known, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        """Every field plus ``digest``: the fingerprint as records, the API and the CLI print it."""
        return {**msgspec.structs.asdict(self), "digest": self.digest}

    def differences(self, other: Fingerprint) -> dict[str, tuple[Any, Any]]:
        """Fields that differ, as ``{name: (mine, theirs)}``: why two runs' keys do not match."""
        return {
            f.name: (getattr(self, f.name), getattr(other, f.name))
            for f in msgspec.structs.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        }


class KeyUsage(msgspec.Struct, gc=False):
    """What one process did with one key. Counts and seconds are totals for the process so far."""

    key: Key
    event: Event  # the most informative event seen: write > compiled > hit
    function: Text = ""  # the key's module name when empty
    hits: Count = 0
    compiles: Count = 0
    writes: Count = 0
    reason: Text | None = None  # why a compiled program was not written, as JAX says it
    compile_s: Seconds | None = None  # measured by this process (JAX stores only whole seconds)
    retrieval_s: Seconds = 0.0  # total seconds spent reading and loading it on hits
    saved_s: SignedSeconds = 0.0  # total compile seconds JAX says hits saved (its whole seconds minus retrieval)
    size_bytes: Count | None = None
    first_at: Seconds = 0.0
    last_at: Seconds = 0.0
    sha256: Sha256 | None = None  # of the bytes JAX put; an old "signature" field is ignored
    parts: KeyParts | None = None  # the hash of each part of the key, as JAX computed it (None: not captured)
    program: ProgramSignature | None = None  # the program's entry signature, as its module declares it

    def __post_init__(self) -> None:
        self.function = function_of(self.key, self.function)


def function_of(key: str, function: str) -> str:
    """A key's function: the one its record names, else the key's module name."""
    return function or key.rsplit("-", 1)[0]


class LocalTierCounts(msgspec.Struct, gc=False):
    """What one process's node-local tier did (``enable_cache(local_dir=...)``): JAX read ``directory``, and the
    client filled it from the root on demand and uploaded what JAX wrote there. Bytes and seconds are totals."""

    directory: Text
    loaded: Count = 0  # JAX's lookups answered from the local directory
    loaded_bytes: Count = 0
    fetched: Count = 0  # missing locally, fetched from the root on demand, checked and admitted
    fetched_bytes: Count = 0
    fetched_s: Seconds = 0.0
    skipped: Count = 0  # fetched, and refused by the job's verify mode (compiled instead)
    uploaded: Count = 0  # written by JAX locally, and created in the root
    uploaded_bytes: Count = 0
    uploaded_s: Seconds = 0.0
    upload_failed: Count = 0  # uploads that failed: the entry stays local, and is tried again at the next start
    upload_pending: Count = 0  # uploads not finished when the process exited (tried again at the next start)
    dropped: Count = 0  # local copies removed: gone from the root or replaced there (found at their check), or bad
    evicted: Count = 0  # local copies the client evicted to stay under the size cap
    # Resumed uploads refused: the local file is not the bytes JAX put (the digest kept with the pending mark).
    upload_refused: Count = 0
    healed: Count = 0  # entries found at start without their -atime: the -atime written, or a broken entry removed
    # The job's working set, fetched before JAX asked (JAXCACHE_PREFETCH): how many keys it named, how many were
    # fetched and admitted (with bytes, and seconds from enable_cache until the last one), how many lookups waited
    # for a fetch under way, and how many fetched keys JAX never asked for (a set too wide).
    prefetch_wanted: Count = 0
    prefetched: Count = 0
    prefetched_bytes: Count = 0
    prefetched_s: Seconds = 0.0
    prefetch_waited: Count = 0
    prefetch_unused: Count = 0


class RunRecord(msgspec.Struct, tag_field="schema", tag=SCHEMA):
    """One process of one run of a job. Its ``schema`` field (``jaxcache.run/1``) is the struct's tag."""

    job: Job
    run_id: RunId
    process_index: ProcessIndex
    process_count: Annotated[int, msgspec.Meta(ge=1, lt=2**31)]
    host: Text
    started_at: Seconds
    updated_at: Seconds
    fingerprint: Fingerprint
    topology: Text | None = None
    cache_dir: Text | None = None  # the root as the job spelled it: which cache a report is for
    final: bool = False
    pid: Count | None = None
    # Records from before the field were all written by jobs.
    kind: Annotated[RunKind, msgspec.Meta(description=(
        "what wrote the record: a job, or a warm-up and its --verify run, which are kept out of jobs' figures"
    ))] = JOB
    keys: list[KeyUsage] = msgspec.field(default_factory=list)
    local: LocalTierCounts | None = None  # None: JAX read the root directly
    # The CPUs this process could run on: XLA compiles on the host's CPUs, so a compile measured here (KeyUsage's
    # compile_s) is this machine's (machine_of says which). None: not known (a record from before the field).
    cpus: Annotated[int, msgspec.Meta(ge=1, lt=2**31)] | None = None

    def __post_init__(self) -> None:
        if self.process_index >= self.process_count:
            raise ValueError(f"process_index {self.process_index} is not below process_count {self.process_count}")

    @property
    def name(self) -> str:
        """The record's object name under the cache root."""
        return record_name(self.run_id, self.process_index, self.started_at)

    def to_json(self) -> bytes:
        """Serialize as the JSON the service accepts (the fingerprint with its digest), ``schema`` first: a reader
        finds the tag before the keys (sorted, it came after them, and parsing a record of 200 keys took twice as
        long, the decoder scanning the keys for the tag before decoding them)."""
        data = msgspec.to_builtins(self)
        data["fingerprint"] = self.fingerprint.as_dict()
        return msgspec.json.encode(data)


def machine_of(fingerprint: Fingerprint, cpus: int | None) -> str | None:
    """The machine a process compiled on, in words (``cpu, 2 cores``, ``TPU v5 lite, 224 cores``): its own device
    kind (else backend) and CPUs, as its run record says them; None when the record says neither. A warm-up that
    compiles for a TPU slice or a GPU topology from a CPU node says the node's own (its run record's fingerprint)."""
    device = fingerprint.device_kind or fingerprint.backend
    said = [part for part in (device, None if cpus is None else f"{cpus} core{'s' if cpus != 1 else ''}") if part]
    return ", ".join(said) or None


def day_of(at: float) -> str:
    """The UTC date of Unix time ``at`` as record directories name days (``YYYY-MM-DD``)."""
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d")


def record_name(run_id: str, process_index: int, started_at: float) -> str:
    """``.jaxcache/runs/<UTC date of start>/<run_id>-p<index>.json``."""
    return f"{RUNS_PREFIX}{day_of(started_at)}/{run_id}-p{process_index}.json"


def is_record_name(name: str) -> bool:
    """True for names shaped like a run record's."""
    return name.startswith(RUNS_PREFIX) and name.endswith(".json")


def check_run_id(run_id: str) -> str:
    """A run id becomes part of an object name: letters, digits, ``_``, ``.``, ``-``; at most 128 characters."""
    if not isinstance(run_id, str) or not re.fullmatch(_RUN_ID, run_id):
        raise InvalidInputError(
            f"run id {run_id!r}: use 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return run_id


def check_job(job: str) -> str:
    """A job name is free text without control characters or slashes, 1-200 characters."""
    if not isinstance(job, str) or not re.fullmatch(_JOB, job):
        raise InvalidInputError(f"job name {job!r}: use 1-200 printable characters without '/' or '\\'")
    return job


class _OtherSchema(msgspec.Struct, tag_field="schema", tag="\x00"):
    """Never a record: decoding a union of a record's struct and this one makes its ``schema`` tag required."""


def decode(data: bytes | str | Mapping[str, Any], kind: type[Any], what: str, max_bytes: int) -> Any:
    """``data`` (JSON text or an already decoded object) as a ``kind`` struct, whose tag (its ``schema`` field)
    must be there; :class:`InvalidInputError` says what is wrong and where (``$.keys[3].sha256``).

    A whole float where an integer is expected (``3.0``) counts as that integer, as JSON Schema (and so the API's
    OpenAPI document) has it; only a record the strict decoder refuses pays for that second look."""
    try:
        try:
            if isinstance(data, (bytes, str)):
                if len(data) > max_bytes:
                    raise InvalidInputError(f"{what} is larger than {max_bytes} bytes")
                found = msgspec.json.decode(data, type=kind | _OtherSchema)
            else:
                found = msgspec.convert(data, kind | _OtherSchema)
        except msgspec.ValidationError as exc:
            if "got `float`" not in str(exc):
                raise
            plain = msgspec.json.decode(data) if isinstance(data, (bytes, str)) else data
            found = msgspec.convert(map_leaves(plain, _whole_float_as_int), kind | _OtherSchema)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(f"{what} is malformed: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"{what} is not JSON: {exc}") from None
    except RecursionError:  # the decoder recurses per level: the interpreter's limit bounds the nesting
        raise InvalidInputError(f"{what} is malformed: nested too deeply") from None
    if not isinstance(found, kind):
        raise InvalidInputError(f"{what} is malformed: its schema is not {kind.__struct_config__.tag!r}")
    return found


def _whole_float_as_int(value: Any) -> Any:
    """``value`` as an int where it is a float an int holds exactly (below 2**53)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def parse(data: bytes | str | Mapping[str, Any]) -> RunRecord:
    """Parse and validate a run record. Raises :class:`InvalidInputError` saying what is wrong."""
    record: RunRecord = decode(data, RunRecord, "run record", MAX_RECORD_BYTES)
    return record


def json_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The run record's JSON Schema for an OpenAPI document: the body's schema and the components it refers to."""
    (body,), components = msgspec.json.schema_components([RunRecord], ref_template="#/components/schemas/{name}")
    return body, components


# --- records the service has validated already ----------------------------------------------------------------------


def _unchecked(kind: Any) -> Any:
    """``kind`` without its limits (``Annotated`` metadata), in unions too."""
    if typing.get_origin(kind) is Annotated:
        return _unchecked(typing.get_args(kind)[0])
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, [_unchecked(arg) for arg in typing.get_args(kind)])
    return kind


def _figures_of(struct: type[msgspec.Struct], name: str, kinds: Mapping[str, Any], **config: Any) -> Any:
    """A struct with ``struct``'s fields, defaults and order but not their limits, and ``kinds`` for some fields'
    types."""
    fields: list[Any] = []
    for f in msgspec.structs.fields(struct):
        kind = kinds.get(f.name, _unchecked(f.type))
        if f.default is not msgspec.NODEFAULT:
            fields.append((f.name, kind, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, kind, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, kind))
    return msgspec.defstruct(name, fields, module=__name__, **config)


class _FoldedKey(msgspec.Struct, gc=False):
    def __post_init__(self) -> None:
        self.function = function_of(self.key, self.function)  # type: ignore[attr-defined,has-type]


#: A key of a record as the service folds it: :class:`KeyUsage`'s fields without the limits its validation on the
#: way in checked, its texts (``parts``, ``program``: only a run's first records are read for them) left as JSON.
KeyFigures = _figures_of(KeyUsage, "KeyFigures", {"parts": msgspec.Raw, "program": msgspec.Raw}, bases=(_FoldedKey,),
                         gc=False)
#: A run record as the service folds it: :class:`RunRecord`'s fields, its keys as :data:`KeyFigures`.
RunFigures = _figures_of(RunRecord, "RunFigures", {"keys": types.GenericAlias(list, (KeyFigures,))}, tag_field="schema",
                         tag=SCHEMA)
_TEXTS: dict[str, Any] = {"parts": KeyParts, "program": ProgramSignature}


def text_of(usage: Any, name: str) -> Any:
    """A key's ``parts`` or ``program`` (None: not captured), from a :class:`KeyUsage` or a :data:`KeyFigures`."""
    value = getattr(usage, name)
    return msgspec.json.decode(value, type=_TEXTS[name] | None) if isinstance(value, msgspec.Raw) else value


def parse_figures(data: bytes) -> Any:
    """A run record the service validated when it accepted it, read for folding (:data:`RunFigures`): its limits
    are not checked again, nor its texts read (bench/README.md, "The drain reads what it folds").
    :class:`InvalidInputError` if it does not parse."""
    try:
        return msgspec.json.decode(data, type=RunFigures)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidInputError(f"run record is malformed: {exc}") from None
