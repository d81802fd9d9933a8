"""The prune audit log, written before anything is deleted: a prune's row and every object it plans to delete go
in first (state "running"), its outcome after. A replica that dies mid-prune leaves a "running" row; whoever next
holds that cache's prune lock closes it ("interrupted"), counting the planned objects storage no longer has as
deleted by it. So every deletion the service makes is accounted for, crash or not."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sqlalchemy import insert, select, update

from jaxcache import prune
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import PruneItemRow, PruneRow
from jaxcache.storage import Storage

log = logging.getLogger("jaxcache.service")

RUNNING, DONE, FAILED, INTERRUPTED = "running", "done", "failed", "interrupted"
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
           error: str | None = None) -> None:
    """Write the outcome."""
    errors = ([error] if error else []) + result.errors[:100]
    with catalog.session() as s:
        s.execute(update(PruneRow).where(PruneRow.id == audit_id).values(
            state=state, ended_s=time.time(), deleted=result.deleted, bytes_freed=result.bytes_freed,
            already_gone=result.already_gone, changed=result.changed, errors=errors))


def close_interrupted(catalog: Catalog, cache: str, storage: Storage) -> int:
    """Close the prunes of ``cache`` left "running" by a replica that died; the caller holds the cache's prune lock
    (so none of them is really running). Returns how many were closed."""
    with catalog.session() as s:
        open_ids = list(s.scalars(select(PruneRow.id).where(PruneRow.cache == cache, PruneRow.state == RUNNING)))
    if not open_ids:
        return 0
    present = {info.name for info in storage.iter_objects()}  # one listing, however many objects were planned
    for audit_id in open_ids:
        with catalog.session() as s:
            items = s.execute(select(PruneItemRow.name, PruneItemRow.size_bytes)
                              .where(PruneItemRow.prune_id == audit_id)).all()
        gone = [(name, size) for name, size in items if name not in present]
        result = prune.PruneResult(deleted=len(gone), bytes_freed=sum(size for _, size in gone))
        note = (f"interrupted: the replica running it stopped; at close {len(gone)} of the {len(items)} planned"
                " objects were gone (counted as deleted by this prune) and the rest are still there")
        finish(catalog, audit_id, result, state=INTERRUPTED, error=note)
        log.warning("prune #%d of %s was %s", audit_id, cache, note)
    return len(open_ids)
