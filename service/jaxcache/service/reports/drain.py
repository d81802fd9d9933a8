"""The drain: folds the records waiting in the report inbox (:mod:`.inbox`) into the run tables.

Each pass takes a cache's oldest rows in one write transaction of that cache, folds them (:func:`.reports.fold`:
run rows, usage rows, aggregates, explanations of new misses, digests) and deletes them. On PostgreSQL the rows are
claimed ``FOR UPDATE SKIP LOCKED`` and deleted in the fold's transaction, so replicas draining at once never take
the same row and none folds a row twice. On SQLite the inbox is a database of its own: the rows are read under the
catalog's write lock (one drainer at a time) and deleted once the fold has committed; a crash in between folds them
again, which changes nothing. A record that arrives meanwhile waits for the next pass. docs/service.md, "Run
records"."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Row, Select, bindparam, delete, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.records import RunRecord
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import InboxRow
from jaxcache.service.reports import inbox, malformed
from jaxcache.service.reports.fold import Folded, Item, fold
from jaxcache.service.reports.inbox import REPORT, Accepted

log = logging.getLogger("jaxcache.service")

#: Records one pass folds at most: other writers of the cache (rescans, prunes) wait for its transaction.
PASS_RECORDS = 256


@dataclass(slots=True)
class Drained(Folded):
    """What draining a cache did: :class:`Folded`'s figures summed over its passes, and the rows dropped because
    their record no longer parses (a catalog written by another version) or the catalog refused it, by source."""

    malformed: Counter[str] = field(default_factory=Counter)


def ingest(catalog: Catalog, cache: str, record: RunRecord, *, source: str = REPORT, name: str | None = None,
           root: str | None = None) -> Accepted:
    """Put ``record`` into the inbox of ``cache`` and drain it: the record folded before this returns (with
    whatever else waited). ``stale`` also when the fold found it older than what the catalog holds. Raises
    :class:`InvalidInputError` for a record the catalog cannot hold (a key listed twice, a value a column cannot
    hold)."""
    accepted = inbox.accept(catalog, cache, record, record.to_json(), source=source, name=name)
    drained = drain(catalog, cache, root=root)
    if drained.malformed:
        raise InvalidInputError(f"run record {record.run_id}-p{record.process_index}: the catalog refused it (the "
                                "service's log says why)")
    return replace(accepted, stale=accepted.stale or (drained.stale > 0 and not drained.fresh))


def caches_waiting(catalog: Catalog) -> list[str]:
    """The caches with records in the inbox."""
    with catalog.side_statements() as conn:
        return sorted(conn.execute(select(InboxRow.cache).distinct()).scalars())


def drain(catalog: Catalog, cache: str, *, root: str | None = None) -> Drained:
    """Fold every record of ``cache`` in the inbox (those that arrive meanwhile too), a pass at a time. A pass the
    catalog refuses (a value a column cannot hold) is folded again a record at a time, and the record it refuses
    is dropped and counted malformed: one record never stops the others."""
    out = Drained()
    while True:
        try:
            taken = _pass(catalog, cache, out, root=root)
        except malformed.REFUSALS:
            taken = _pass(catalog, cache, out, root=root, one_at_a_time=True)
        if taken < PASS_RECORDS:
            break
    return out


def _pass(catalog: Catalog, cache: str, out: Drained, *, root: str | None,
          one_at_a_time: bool = False) -> int:
    """Claim, fold and delete up to PASS_RECORDS rows of ``cache`` (a row at a time, each in its own transaction,
    when ``one_at_a_time``); the rows taken."""
    taken = 0
    limit = 1 if one_at_a_time else PASS_RECORDS
    for _ in range(PASS_RECORDS if one_at_a_time else 1):
        with catalog.writing(cache) as s:
            if catalog.side_apart:
                # Read under the catalog's write lock: another drainer's rows are folded and committed by then.
                with catalog.side_statements() as conn:
                    rows = conn.execute(_claim(catalog, cache, limit)).all()
            else:  # claimed in the fold's own transaction: it commits their deletion with the fold
                rows = s.execute(_claim(catalog, cache, limit)).all()
            if not rows:
                break
            folded, dropped = _fold_rows(catalog, s, cache, rows, root=root, one_at_a_time=one_at_a_time)
            if not catalog.side_apart:
                _delete(s.connection(), cache, rows)
            elif dropped:
                # Gone before the catalog's write lock is: another drainer would read them next, and drop them again.
                with catalog.side_write() as side:
                    _delete(side.connection(), cache, [row for row, _ in dropped])
        if catalog.side_apart:
            # After the fold's commit: a crash in between folds the rows again, which changes nothing (a record is
            # its process's totals). A newer version that arrived meanwhile stays for the next pass.
            with catalog.side_write() as s:
                _delete(s.connection(), cache, rows)
        for row, exc in dropped:  # deleted for good: counted once (a pass refused and taken again drops them anew)
            _dropped(cache, row, exc, out)
        catalog.count_misses(cache, folded.misses)  # committed: counted once
        out.fresh.update(folded.fresh)
        out.stale += folded.stale
        out.misses.update(folded.misses)
        taken += len(rows)
    return taken


def _fold_rows(catalog: Catalog, s: Session, cache: str, rows: Sequence[Row], *, root: str | None,
               one_at_a_time: bool) -> tuple[Folded, list[tuple[Row, Exception]]]:
    """Fold ``rows``; what that did, and the rows to drop (they do not decode, or the catalog refused the record)
    with why."""
    items: list[Item] = []
    dropped: list[tuple[Row, Exception]] = []
    for row in rows:
        try:
            record = _record_of(inbox.body_of(bytes(row.body)))
        except InvalidInputError as exc:  # accepted by another version of the service, and no record now
            dropped.append((row, exc))
            continue
        items.append(Item(record, row.source, row.record))
    try:
        with s.begin_nested():
            return fold(catalog, s, cache, items, root=root), dropped
    except malformed.REFUSALS as exc:
        if not one_at_a_time:
            raise
        return Folded(), [*dropped, (rows[0], exc)]


def _record_of(body: bytes) -> Any:
    """An inbox row's record: validated when it was accepted, so read for folding alone, unless its schema is not
    this version's (a row another version of the service accepted), which is read again in full."""
    try:
        return records.parse_figures(body)  # only a record of the current schema (records.SCHEMA) decodes here
    except InvalidInputError:
        return records.parse(body)  # validated again, or refused saying why


def _delete(conn: Connection, cache: str, rows: Sequence[Row]) -> None:
    """Delete the versions of the records in ``rows`` from the inbox."""
    done = delete(InboxRow).where(InboxRow.cache == cache, InboxRow.run_id == bindparam("run_id"),
                                  InboxRow.process_index == bindparam("process_index"),
                                  InboxRow.updated_s == bindparam("updated_s"))
    conn.execute(done, [{"run_id": r.run_id, "process_index": r.process_index, "updated_s": r.updated_s}
                        for r in rows])


def _dropped(cache: str, row: Row, exc: Exception, out: Drained) -> None:
    log.warning("run record %s-p%d of %s dropped from the inbox: %s", row.run_id, row.process_index, cache,
                malformed.reason(exc))
    out.malformed[row.source] += 1


def _claim(catalog: Catalog, cache: str, limit: int) -> Select:
    q = (select(InboxRow.run_id, InboxRow.process_index, InboxRow.updated_s, InboxRow.source, InboxRow.record,
                InboxRow.body)
         .where(InboxRow.cache == cache).order_by(InboxRow.received_s).limit(limit))
    return q.with_for_update(skip_locked=True) if catalog.dialect == "postgresql" else q

