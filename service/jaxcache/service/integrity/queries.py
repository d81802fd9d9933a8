"""Integrity verdicts as the catalog holds them: counts by class, attested and unverified entries, problems."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.engine import Connection

from jaxcache import integrity
from jaxcache.service.catalog.models import AttestationConflictRow, AttestationRow, EntryRow, VerificationRow
from jaxcache.service.integrity.attestations import CHUNK


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


def conflicts(conn: Connection, cache: str, *, limit: int = 1000,
              keys: list[str] | None = None) -> list[dict[str, Any]]:
    """Entries (or those of ``keys``) with several recorded digests: the one that counts, then the others newest
    first; ``limit`` digests in all."""
    a, c = AttestationRow, AttestationConflictRow
    query = (select(c.key, c.sha256, c.writer, c.source, c.record, c.seen_s, a.sha256.label("counted"),
                    a.writer.label("counted_by"), a.source.label("counted_source"))
             .join(a, and_(a.cache == c.cache, a.key == c.key)).where(c.cache == cache))
    rows: list[Any] = []
    for part in [None] if keys is None else [keys[i : i + CHUNK] for i in range(0, len(keys), CHUNK)]:
        if len(rows) < limit:
            which = query if part is None else query.where(c.key.in_(part))
            rows += conn.execute(which.order_by(c.key, c.seen_s.desc()).limit(limit - len(rows))).all()
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        found = out.setdefault(r.key, {"key": r.key, "sha256": r.counted, "writer": r.counted_by,
                                       "source": r.counted_source, "others": []})
        found["others"].append({"sha256": r.sha256, "writer": r.writer, "source": r.source, "record": r.record,
                                "seen_s": r.seen_s})
    return list(out.values())


def classes_of(conn: Connection, cache: str) -> dict[str, str]:
    """``{key: class}`` of every verified entry (for prune policies)."""
    v = VerificationRow
    return {r.key: r.classification for r in conn.execute(select(v.key, v.classification).where(v.cache == cache))}
