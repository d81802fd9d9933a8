"""Writers' digests into the catalog, stamped with the service's clock so none back-dates itself: the first accepted
counts (unsigned digests prove no more than write access), others are kept as conflicts, never replacing it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache.attestations import Attestation, prefer
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import AttestationConflictRow, AttestationRow

CHUNK = 500  # keys a query names at most (IN lists)


def _row(cache: str, a: Attestation) -> dict[str, object]:
    return dict(cache=cache, key=a.key, sha256=a.sha256, size_bytes=a.size_bytes, writer=a.writer[:512], at_s=a.at,
                source=a.source, record=a.record, platform=a.platform)


def _attestation(r: Any) -> Attestation:
    return Attestation(r.key, r.sha256, r.size_bytes, r.writer, r.at_s, r.source, r.record, r.platform)


def record(catalog: Catalog, cache: str, found: Iterable[Attestation]) -> int:
    """Accept ``found`` (in order) for ``cache``; returns how many keys' counted digest changed."""
    todo = list(found)
    if not todo:
        return 0
    with catalog.writing(cache) as s:
        return record_in(catalog, s, cache, todo)


def record_in(catalog: Catalog, s: Session, cache: str, todo: list[Attestation]) -> int:
    """:func:`record` in ``s``'s write transaction (one the caller took with ``catalog.writing(cache)``)."""
    changed = 0
    keys = sorted({a.key for a in todo})
    existing: dict[str, AttestationRow] = {}
    for i in range(0, len(keys), CHUNK):
        existing.update((r.key, r) for r in s.scalars(select(AttestationRow).where(
            AttestationRow.cache == cache, AttestationRow.key.in_(keys[i : i + CHUNK]))))
    conflicts: list[Attestation] = []
    for att in todo:
        row = existing.get(att.key)
        winner, other = prefer(None if row is None else _attestation(row), att)
        if other is not None:
            conflicts.append(other)
        if row is None:
            row = existing[att.key] = AttestationRow(**_row(cache, winner))
            s.add(row)
            changed += 1
        elif (winner.sha256, winner.source) != (row.sha256, row.source):
            for name, value in _row(cache, winner).items():
                setattr(row, name, value)
            changed += 1
    for other in conflicts:
        s.execute(catalog.insert(AttestationConflictRow).values(
            cache=cache, key=other.key, sha256=other.sha256, size_bytes=other.size_bytes,
            writer=other.writer[:512], source=other.source, record=other.record, seen_s=other.at,
        ).on_conflict_do_nothing(index_elements=["cache", "key", "sha256"]))
    return changed


def load(conn: Connection, cache: str, keys: list[str]) -> dict[str, Attestation]:
    """The digests that count for ``keys`` of a cache."""
    q = select(AttestationRow).where(AttestationRow.cache == cache)
    return {r.key: _attestation(r) for i in range(0, len(keys), CHUNK)
            for r in conn.execute(q.where(AttestationRow.key.in_(keys[i : i + CHUNK])))}


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
