"""Digests that writers recorded for the entries they wrote: the catalog's side of ``jaxcache.integrity``.

JAX never rewrites a key, so the first recorded digest of a key is the one its bytes must keep; later records of
the same key (a second writer racing the first) do not replace it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Connection

from jaxcache.integrity import Attestation
from jaxcache.records import WRITE, RunRecord
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import AttestationRow

_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Digest:
    """One writer's digest of one key."""

    key: str
    sha256: str
    size_bytes: int | None
    writer: str
    at_s: float


def from_run(record: RunRecord) -> list[Digest]:
    """The digests a client run record carries (keys it wrote and read back)."""
    return [Digest(u.key, u.sha256, u.size_bytes, f"job {record.job} run {record.run_id} p{record.process_index}",
                   u.first_at or record.started_at)
            for u in record.keys if u.sha256 and u.event == WRITE]


def record(catalog: Catalog, cache: str, digests: Iterable[Digest]) -> int:
    """Store digests for keys that have none yet, or replace a later writer's with an earlier one's."""
    todo: dict[str, Digest] = {}
    for d in digests:
        if d.key not in todo or d.at_s < todo[d.key].at_s:
            todo[d.key] = d
    if not todo:
        return 0
    stored = 0
    with catalog.writing(cache) as s:
        keys = list(todo)
        for i in range(0, len(keys), _CHUNK):
            chunk = keys[i : i + _CHUNK]
            existing = {r.key: r for r in s.scalars(select(AttestationRow).where(
                AttestationRow.cache == cache, AttestationRow.key.in_(chunk)))}
            for key in chunk:
                d, old = todo[key], existing.get(key)
                if old is None:
                    s.add(AttestationRow(cache=cache, key=key, sha256=d.sha256, size_bytes=d.size_bytes,
                                         writer=d.writer[:512], at_s=d.at_s))
                    stored += 1
                elif d.at_s < old.at_s:
                    old.sha256, old.size_bytes, old.writer, old.at_s = d.sha256, d.size_bytes, d.writer[:512], d.at_s
                    stored += 1
    return stored


def load(conn: Connection, cache: str, keys: Iterable[str] | None = None) -> dict[str, Attestation]:
    """Attestations of a cache (all, or of ``keys``)."""
    q = select(AttestationRow).where(AttestationRow.cache == cache)
    out: dict[str, Attestation] = {}
    key_list = None if keys is None else list(keys)
    chunks = [None] if key_list is None else [key_list[i : i + _CHUNK] for i in range(0, len(key_list), _CHUNK)]
    for chunk in chunks:
        qq = q if chunk is None else q.where(AttestationRow.key.in_(chunk))
        for r in conn.execute(qq):
            out[r.key] = Attestation(r.key, r.sha256, r.size_bytes, r.writer, r.at_s)
    return out
