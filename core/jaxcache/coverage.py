"""Warm-up coverage records: what one ``warmup`` run put in (or found in) a cache, for which topology. The one
schema of the format (``jaxcache.warmup/1``): warm-up writes it under ``<root>/.jaxcache/warmups/<id>.json``,
the service and integrity checks read it. Limits match the catalog's columns."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import msgspec

from jaxcache.errors import InvalidInputError
from jaxcache.keyparts import KeyParts, ProgramSignature
from jaxcache.records import RECORDS_DIR, Fingerprint, Key, Seconds, Sha256, ShortText, Text, decode
from jaxcache.topology import parse_any_topology

SCHEMA = "jaxcache.warmup/1"
WARMUPS_PREFIX = f"{RECORDS_DIR}/warmups/"
MAX_COVERAGE_BYTES = 32 * 1024 * 1024

Status = Literal["written", "present", "not_written"]
WRITTEN: Final = "written"  # compiled and stored by this warm-up
PRESENT: Final = "present"  # already in the cache: a hit
NOT_WRITTEN: Final = "not_written"  # compiled but JAX did not store it (reason says why)
STATUSES: tuple[Status, ...] = (WRITTEN, PRESENT, NOT_WRITTEN)

_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
WarmupId = Annotated[str, msgspec.Meta(pattern=f"^{_ID}$")]


class ProgramCoverage(msgspec.Struct, frozen=True):
    """One program the warm-up compiled or found."""

    key: Key
    function: Text
    status: Status
    compile_s: Seconds | None = None
    size_bytes: Annotated[int, msgspec.Meta(ge=0, lt=2**53)] | None = None
    reason: Text | None = None
    sha256: Sha256 | None = None  # of the bytes JAX put (written programs only); old "signature" ignored
    parts: KeyParts | None = None  # the hash of each part of the key, as JAX computed it
    program: ProgramSignature | None = None  # the program's entry signature, as its module declares it


class WarmupRecord(msgspec.Struct, frozen=True, tag_field="schema", tag=SCHEMA):
    """One warm-up run. Its ``schema`` field (``jaxcache.warmup/1``) is the struct's tag."""

    id: WarmupId
    job: ShortText
    topology: Annotated[str, msgspec.Meta(max_length=64)]
    platform: Annotated[str, msgspec.Meta(max_length=16, pattern=r"^[a-z0-9]+$")]
    started_at: Seconds
    finished_at: Seconds
    fingerprint: Fingerprint
    cache_dir: Text
    gpu_model: ShortText | None = None
    programs: tuple[ProgramCoverage, ...] = ()

    def __post_init__(self) -> None:
        # One spelling per topology; InvalidInputError (a ValueError) becomes msgspec's validation error.
        msgspec.structs.force_setattr(self, "topology", str(parse_any_topology(self.topology)))

    @property
    def name(self) -> str:
        """The record's object name under the cache root."""
        return f"{WARMUPS_PREFIX}{self.id}.json"

    def to_json(self) -> bytes:
        """Serialize as stored and as the service accepts it (the fingerprint with its digest)."""
        data = msgspec.to_builtins(self)
        data["fingerprint"] = self.fingerprint.as_dict()
        return msgspec.json.encode(data, order="sorted")


def check_id(warmup_id: str) -> str:
    """Ids become object names: letters, digits, ``_``, ``.``, ``-``; at most 128 characters."""
    if not isinstance(warmup_id, str) or not re.fullmatch(_ID, warmup_id):
        raise InvalidInputError(f"warm-up id {warmup_id!r}: use 1-128 letters, digits, '_', '.' or '-'")
    return warmup_id


def parse(data: bytes | str | Mapping[str, Any]) -> WarmupRecord:
    """Parse and validate a coverage record; :class:`InvalidInputError` says what is wrong."""
    record: WarmupRecord = decode(data, WarmupRecord, "coverage record", MAX_COVERAGE_BYTES)
    return record
