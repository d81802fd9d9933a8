"""The audit log of applied prunes."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache.service.catalog.models import PruneRow


def prunes(s: Session | Connection, cache: str, *, limit: int, audit_id: int | None = None) -> list[dict]:
    """Applied prunes of a cache, newest first (the audit log): who, when, policy, counts, bytes."""
    q = select(PruneRow.id, PruneRow.at_s, PruneRow.who, PruneRow.policy, PruneRow.deleted, PruneRow.bytes_freed,
               PruneRow.already_gone, PruneRow.changed, PruneRow.errors, PruneRow.kind, PruneRow.state,
               PruneRow.planned, PruneRow.planned_bytes, PruneRow.ended_s).where(PruneRow.cache == cache)
    if audit_id is not None:
        q = q.where(PruneRow.id == audit_id)
    return [dict(r._mapping) for r in s.execute(q.order_by(PruneRow.id.desc()).limit(limit))]
