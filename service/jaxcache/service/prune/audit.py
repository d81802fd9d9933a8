"""The prune audit log, written before anything is deleted; the next holder of a cache's prune lock closes a dead
replica's "running" prune as "interrupted", so every deletion is accounted for."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import cast

from sqlalchemy import Select, insert, select, update
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.orm import Session

from jaxcache import prune
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import DONE, INTERRUPTED, RUNNING, PruneItemRow, PruneRow
from jaxcache.storage import Storage

log = logging.getLogger("jaxcache.service")

_CHUNK = 5000


def begin(catalog: Catalog, cache: str, decisions: Sequence[prune.Decision], *, who: str, policy_json: dict,
          kind: str = "prune") -> int:
    """Write the intent: the audit row and each planned object, committed before the first delete."""
    with catalog.session() as s:
        row = PruneRow(cache=cache, at_s=time.time(), who=who, policy=policy_json, kind=kind, state=RUNNING,
                       planned=len(decisions), planned_bytes=sum(d.candidate.size_bytes for d in decisions),
                       deleted=0, bytes_freed=0, already_gone=0, changed=0, errors=[])
        s.add(row)
        s.flush()
        audit_id = row.id
        items = [{"prune_id": audit_id, "name": d.candidate.name, "key": d.candidate.key,
                  "size_bytes": d.candidate.size_bytes} for d in decisions]
        for i in range(0, len(items), _CHUNK):
            s.execute(insert(PruneItemRow), items[i : i + _CHUNK])
    return audit_id


def finish(catalog: Catalog, audit_id: int, result: prune.PruneResult, *, state: str = DONE,
           error: str | None = None) -> bool:
    """Write the outcome over a row still "running"; whether it was written (a row closed meanwhile stays)."""
    errors = ([error] if error else []) + result.errors[:100]
    with catalog.session() as s:
        written = cast(CursorResult, s.execute(update(PruneRow).where(PruneRow.id == audit_id,
                                                                      PruneRow.state == RUNNING).values(
            state=state, ended_s=time.time(), deleted=result.deleted, bytes_freed=result.bytes_freed,
            already_gone=result.already_gone, changed=result.changed, errors=errors)))
    return bool(written.rowcount)


def _running(cache: str) -> Select:
    return select(PruneRow.id).where(PruneRow.cache == cache, PruneRow.state == RUNNING)


def any_running(catalog: Catalog, cache: str) -> bool:
    """Whether a prune of ``cache`` reads "running" (running, or left so by a replica that died)."""
    with catalog.reader() as conn:
        return conn.execute(_running(cache).limit(1)).first() is not None


@dataclasses.dataclass(frozen=True)
class Interrupted:
    """A prune left "running" by a replica that died, with what storage no longer has of its plan."""

    audit_id: int
    result: prune.PruneResult
    planned: int


def tally_interrupted(catalog: Catalog, cache: str, storage: Storage) -> list[Interrupted]:
    """Prunes of ``cache`` a dead replica left "running"; the caller holds the cache's prune lock."""
    with catalog.session() as s:
        open_ids = list(s.scalars(_running(cache)))
    if not open_ids:
        return []
    present = {info.name for info in storage.iter_objects()}  # one listing, however many objects were planned
    found = []
    for audit_id in open_ids:
        with catalog.session() as s:
            items = s.execute(select(PruneItemRow.name, PruneItemRow.size_bytes)
                              .where(PruneItemRow.prune_id == audit_id)).all()
        gone = [(name, size) for name, size in items if name not in present]
        result = prune.PruneResult(deleted=len(gone), bytes_freed=sum(size for _, size in gone))
        found.append(Interrupted(audit_id, result, len(items)))
    return found


def close(catalog: Catalog, cache: str, interrupted: Sequence[Interrupted]) -> int:
    """Close what :func:`tally_interrupted` found, its gone objects counted as deleted; returns how many it closed."""
    closed = 0
    for one in interrupted:
        note = (f"interrupted: the replica running it stopped; at close {one.result.deleted} of the {one.planned}"
                " planned objects were gone (counted as deleted by this prune) and the rest are still there")
        if finish(catalog, one.audit_id, one.result, state=INTERRUPTED, error=note):
            closed += 1
            log.warning("prune #%d of %s was %s", one.audit_id, cache, note)
    return closed


def prunes(s: Session | Connection, cache: str, *, limit: int, audit_id: int | None = None) -> list[dict]:
    """Applied prunes of a cache, newest first (the audit log): who, when, policy, counts, bytes."""
    q = select(*(c for c in PruneRow.__table__.c if c.name != "cache")).where(PruneRow.cache == cache)
    if audit_id is not None:
        q = q.where(PruneRow.id == audit_id)
    return [dict(r._mapping) for r in s.execute(q.order_by(PruneRow.id.desc()).limit(limit))]
