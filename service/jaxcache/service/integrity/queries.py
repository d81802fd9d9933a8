"""Integrity verdicts as the catalog holds them: counts by class, attested and unverified entries, problems."""

from __future__ import annotations

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.engine import Connection

from jaxcache import integrity
from jaxcache.service.catalog.attestations import conflicts
from jaxcache.service.catalog.models import AttestationRow, EntryRow, VerificationRow


def summary(conn: Connection, cache: str, *, limit: int = 1000) -> dict:
    """Counts by class, how many entries are attested and unverified, and the bad entries with reasons."""
    v = VerificationRow
    current = and_(v.cache == EntryRow.cache, v.key == EntryRow.key)
    counts = dict.fromkeys(integrity.CLASSES, 0) | dict(conn.execute(
        select(v.classification, func.count()).join(EntryRow, current)
        .where(EntryRow.cache == cache, EntryRow.kind == "entry").group_by(v.classification)).all())
    total, attested = conn.execute(
        select(func.count(), func.count(AttestationRow.key)).select_from(EntryRow)
        .outerjoin(AttestationRow, and_(AttestationRow.cache == EntryRow.cache, AttestationRow.key == EntryRow.key))
        .where(EntryRow.cache == cache, EntryRow.kind == "entry")).one()
    last = conn.execute(select(func.max(v.checked_s)).where(v.cache == cache)).scalar_one()
    held = integrity.TAMPERED, integrity.MISMATCHED, integrity.CORRUPT  # mismatched acts only where pinned
    # A bad signature is named whatever the entry's class: someone who could write the root put it there. Listed
    # after the bad classes, so that planting bad signatures can never push a proven-bad entry past the limit (jobs
    # with verify="attested" refuse only the entries listed).
    problem = or_(v.classification.in_(integrity.BAD_CLASSES + (integrity.PENDING,)), v.signature.is_not(None))
    rank = case((v.classification.in_(held), 0), (v.classification.in_(integrity.BAD_CLASSES), 1),
                (v.classification == integrity.PENDING, 2), else_=3)
    bad = conn.execute(
        select(v.key, v.classification, v.classes, v.reasons, v.sha256, v.attested_sha256, v.attested_by,
               v.embedded_module, v.checked_s, v.signature)
        .join(EntryRow, current)
        .where(EntryRow.cache == cache, EntryRow.kind == "entry", problem)
        .order_by(rank, v.classification, v.key).limit(limit)).all()
    signed_badly = conn.execute(
        select(func.count()).select_from(v).join(EntryRow, current)
        .where(EntryRow.cache == cache, EntryRow.kind == "entry", v.signature.is_not(None))).scalar_one()
    verified = sum(counts.values())
    return {"cache": cache, "entries": total, "verified": verified, "unverified": total - verified,
            "attested": attested, "counts": counts, "bad_signatures": signed_badly, "last_checked_s": last,
            "held_up": sum(counts[c] for c in held),
            "problems": [dict(r._mapping) | {"class": r.classification, "held_up": r.classification in held}
                         for r in bad],
            "conflicts": conflicts(conn, cache, limit=limit)}
