"""Why a program a warm-up stored (or a cache already held) missed in a later process: ``--verify``'s fresh process
and ``--check`` on a target node, explained part by part with :mod:`jaxcache.explain`."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import msgspec

from jaxcache import coverage, records
from jaxcache.explain import Known, explain
from jaxcache.explain.from_root import RootHistory
from jaxcache.keyparts import KeyParts, ProgramSignature
from jaxcache.records import Fingerprint
from jaxcache.storage import Storage


def miss_of(key: dict[str, Any], fingerprint: Fingerprint, *, run_id: str, job: str, topology: str | None,
            at: float | None = None) -> Known:
    """A program a process compiled, as ``--verify``'s child or ``--check`` reports it (a dict with ``key``,
    ``function`` and, where captured, ``parts`` and ``program``)."""
    parts = msgspec.convert(key["parts"], KeyParts) if key.get("parts") else None
    program = msgspec.convert(key["program"], ProgramSignature) if key.get("program") else None
    return Known(key=key["key"], function=key["function"], event=records.COMPILED, at=at or time.time(), job=job,
                 run_id=run_id, parts=parts, program=program, fingerprint=fingerprint, topology=topology)


def program_dict(p: coverage.ProgramCoverage) -> dict[str, Any]:
    """A coverage record's program as ``miss_of`` reads it."""
    return {"key": p.key, "function": p.function, "parts": msgspec.to_builtins(p.parts) if p.parts else None,
            "program": msgspec.to_builtins(p.program) if p.program else None}


def explained(storage: Storage, misses: Iterable[Known], knowns: Iterable[Known]) -> list[dict[str, Any]]:
    """Each miss with its cause, what differs, the nearest key and the fix, against ``knowns`` (what the
    warm-up or the root's records say) and the entries the root holds now."""
    history = RootHistory(storage, knowns, storage.iter_objects())
    out = []
    for miss in misses:
        why = explain(miss, history, root=storage.url)
        out.append({"key": miss.key, "function": miss.function, **why.as_dict()})
    return out
