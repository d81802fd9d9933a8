"""A run record as ingestion takes it (:class:`Report`): its header, its keys' figures as columns, their parts and
programs already as the JSON text the catalog stores, and the keys that carry a digest. Made once from the parsed
record where it was checked (a worker's parse thread, a rescan); the report writer process decodes it without
validating the record again (the worker did), and without a Python object per key's parts: validating and
decoding a final record of 200 keys again was 1.5 ms of the writer's time, the one process a storm waits on.

A POSTed body is parsed by :func:`report_of_json`, which keeps each key's parts and program as the JSON they came
as: a job's processes send the same ones for the same keys, so each distinct text is validated once per process
(and kept, up to :data:`KNOWN_TEXTS`), instead of being decoded into objects and encoded back into text for every
record: that was half of a worker's parsing of a final record.
"""

from __future__ import annotations

import re
import typing
from typing import Any

import msgspec

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.keyparts import KeyParts, ProgramSignature
from jaxcache.records import WRITE, KeyUsage, RunRecord
from jaxcache.service.ingestion import patterns
from jaxcache.service.ingestion.figures import Figures, of_keys, of_record

_json = msgspec.json.Encoder()


class Report(msgspec.Struct, gc=False):
    """``header``: the record without its keys; ``parts`` and ``programs``: each key's, as JSON text (None: not
    captured); ``digests``: the keys the process wrote and read back a digest of (its attestations)."""

    header: RunRecord
    figures: Figures
    parts: list[str | int | None]  # a number: a text sent before on the report writer's connection (wire.Texts)
    programs: list[str | int | None]
    digests: list[KeyUsage]

    @property
    def run_id(self) -> str:
        return self.header.run_id

    @property
    def process_index(self) -> int:
        return self.header.process_index

    @property
    def keys(self) -> list[str]:
        return self.figures.keys

    def attested(self) -> RunRecord:
        """The record with only the keys whose digests it carries: what :func:`jaxcache.attestations.from_run`
        reads."""
        return msgspec.structs.replace(self.header, keys=self.digests)


def report_of(record: RunRecord) -> Report:
    """``record`` (parsed, so valid) as ingestion takes it."""
    keys = record.keys
    return Report(
        msgspec.structs.replace(record, keys=[]), of_record(record),
        [None if u.parts is None else _json.encode(u.parts).decode() for u in keys],
        [None if u.program is None else _json.encode(u.program).decode() for u in keys],
        [u for u in keys if u.sha256 and u.event == WRITE])


def _keeping_json(struct: Any, name: str, raw: tuple[str, ...], types: dict[str, Any], **config: Any) -> Any:
    """A struct with the fields, defaults, checks and ``__post_init__`` of ``struct``, but the ``raw`` fields kept
    as the JSON they came as (``msgspec.Raw``; empty when absent) and the ``types`` fields of other types."""
    hints = typing.get_type_hints(struct, include_extras=True)
    fields: list[Any] = []
    for f in msgspec.structs.fields(struct):
        if f.name in raw:
            fields.append((f.name, msgspec.Raw, msgspec.Raw()))
        elif f.default is not msgspec.NODEFAULT:
            fields.append((f.name, types.get(f.name, hints[f.name]), f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, types.get(f.name, hints[f.name]), msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, types.get(f.name, hints[f.name])))
    return msgspec.defstruct(name, fields, namespace={"__post_init__": struct.__post_init__}, **config)


_TEXTS = ("parts", "program")
_RawKey = _keeping_json(KeyUsage, "KeyUsage", _TEXTS, {}, gc=False)
_RawRecord = _keeping_json(RunRecord, "RunRecord", (), {"keys": list[_RawKey]},  # type: ignore[valid-type]
                           tag_field="schema", tag=records.SCHEMA)
_unpatterned, _CHECKS = patterns.unpatterned(KeyUsage)
_QuickKey = _keeping_json(KeyUsage, "KeyUsage", _TEXTS, _unpatterned, gc=False)
_QuickRecord = _keeping_json(RunRecord, "RunRecord", (), {"keys": list[_QuickKey]},  # type: ignore[valid-type]
                             tag_field="schema", tag=records.SCHEMA)
_HEADER = tuple(f.name for f in msgspec.structs.fields(RunRecord) if f.name != "keys")
_KEY = tuple(f.name for f in msgspec.structs.fields(KeyUsage) if f.name not in _TEXTS)

#: Parts and programs texts a process keeps once checked, by the JSON they came as (about 1 KB each with it).
KNOWN_TEXTS = 4096
_known: dict[bytes, str] = {}


def report_of_json(body: bytes) -> Report:
    """The run record in ``body`` (JSON) as ingestion takes it; :class:`InvalidInputError` as
    :func:`jaxcache.records.parse` raises it."""
    found = _quick(body)
    if found is None:  # refused, or not provably valid: the record format's own types say what is wrong
        found = records.decode(body, _RawRecord, "run record", records.MAX_RECORD_BYTES)
    keys = found.keys
    parts = _texts([u.parts for u in keys], KeyParts, "parts")
    programs = _texts([u.program for u in keys], ProgramSignature, "program")
    header = RunRecord(**{n: getattr(found, n) for n in _HEADER})
    digests = [KeyUsage(**{n: getattr(u, n) for n in _KEY}) for u in keys if u.sha256 and u.event == WRITE]
    return Report(header, of_keys(keys), parts, programs, digests)


def _quick(body: bytes) -> Any:
    """The record decoded with its keys' patterns checked all at once, or None where that did not prove it valid."""
    try:  # as the record format decodes it (its size, its schema tag required), less the keys' patterns
        found = records.decode(body, _QuickRecord, "run record", records.MAX_RECORD_BYTES)
    except InvalidInputError:
        return None
    return found if patterns.all_match(found.keys, _CHECKS) else None


def _texts(raws: list[msgspec.Raw], kind: type, field: str) -> list[str | int | None]:
    """Each key's parts or program as the catalog's text (None: not given), checked as the record format says."""
    known = _known
    out: list[str | int | None] = []
    for raw in raws:
        data = bytes(raw)
        text = known.get(data)
        out.append(text if text is not None else _checked(data, kind, len(out), field))
    return out


_AT = re.compile(r" - at `\$")


def _checked(data: bytes, kind: type, index: int, field: str) -> str | None:
    if not data or data == b"null":
        return None
    try:
        value = msgspec.json.decode(data, type=kind | None)  # as the record format says it
    except msgspec.ValidationError as exc:
        where = f"$.keys[{index}].{field}"
        message = _AT.sub(lambda _: f" - at `{where}", str(exc)) if _AT.search(str(exc)) else f"{exc} - at `{where}`"
        raise InvalidInputError(f"run record is malformed: {message}") from None
    text = _json.encode(value).decode()
    if len(_known) >= KNOWN_TEXTS:
        _known.clear()
    _known[data] = text
    return text
