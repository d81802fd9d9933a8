"""Warm-up coverage records: what one ``warmup`` run put in (or found in) a cache, for which topology.

Written by :mod:`jaxcache.warmup` under ``<root>/.jaxcache/warmups/<id>.json``; read by the service, which tells
how many of its keys jobs have hit since. One definition of the format for both sides.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from jaxcache import entry as fmt
from jaxcache.errors import InvalidInputError
from jaxcache.records import RECORDS_DIR, Fingerprint
from jaxcache.topology import parse_topology

SCHEMA = "jaxcache.warmup/1"
WARMUPS_PREFIX = f"{RECORDS_DIR}/warmups/"
MAX_COVERAGE_BYTES = 32 * 1024 * 1024

WRITTEN = "written"  # compiled and stored by this warm-up
PRESENT = "present"  # already in the cache: a hit
NOT_WRITTEN = "not_written"  # compiled but JAX did not store it (reason says why)
STATUSES = (WRITTEN, PRESENT, NOT_WRITTEN)

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True, slots=True)
class ProgramCoverage:
    """One program the warm-up compiled or found."""

    key: str
    function: str
    status: str
    compile_s: float | None = None
    size_bytes: int | None = None
    reason: str | None = None
    sha256: str | None = None  # of the stored bytes, read back after JAX wrote them (written programs only)


@dataclass(frozen=True, slots=True)
class WarmupRecord:
    """One warm-up run."""

    id: str
    job: str
    topology: str
    platform: str
    started_at: float
    finished_at: float
    fingerprint: Fingerprint
    cache_dir: str
    gpu_model: str | None = None
    programs: tuple[ProgramCoverage, ...] = field(default_factory=tuple)
    schema: str = SCHEMA

    @property
    def name(self) -> str:
        """The record's object name under the cache root."""
        return f"{WARMUPS_PREFIX}{self.id}.json"

    def to_json(self) -> bytes:
        """Serialize as stored and as the service accepts it."""
        data = {**asdict(self), "fingerprint": self.fingerprint.as_dict()}
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def check_id(warmup_id: str) -> str:
    """Ids become object names: letters, digits, ``_``, ``.``, ``-``; at most 128 characters."""
    if not isinstance(warmup_id, str) or not _ID_RE.fullmatch(warmup_id):
        raise InvalidInputError(f"warm-up id {warmup_id!r}: use 1-128 letters, digits, '_', '.' or '-'")
    return warmup_id


def parse(data: bytes | str | Mapping[str, Any]) -> WarmupRecord:
    """Parse and validate a coverage record; :class:`InvalidInputError` says what is wrong."""
    if isinstance(data, (bytes, str)):
        if len(data) > MAX_COVERAGE_BYTES:
            raise InvalidInputError(f"coverage record is larger than {MAX_COVERAGE_BYTES} bytes")
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"coverage record is not JSON: {exc}") from None
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        raise InvalidInputError(f"not a {SCHEMA} coverage record")
    try:
        fp = dict(data["fingerprint"])
        fp.pop("digest", None)
        fingerprint = Fingerprint(**fp)
        programs = []
        for raw in data.get("programs", []):
            program = ProgramCoverage(**raw)
            if not fmt.is_valid_key(program.key) or program.status not in STATUSES:
                raise InvalidInputError(f"coverage record program {raw!r} has a bad key or status")
            programs.append(program)
        record = WarmupRecord(
            id=check_id(data["id"]),
            job=str(data["job"]),
            topology=str(parse_topology(data["topology"])),
            platform=str(data["platform"]),
            started_at=float(data["started_at"]),
            finished_at=float(data["finished_at"]),
            fingerprint=fingerprint,
            cache_dir=str(data["cache_dir"]),
            gpu_model=data.get("gpu_model"),
            programs=tuple(programs),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, InvalidInputError):
            raise
        raise InvalidInputError(f"coverage record is malformed: {exc!r}") from None
    return record
