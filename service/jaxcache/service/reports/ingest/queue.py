"""The report queue: run records accepted into the inbox (POSTed, or read from their file by a rescan), and the
drain that folds them into the run tables. docs/service.md, "The report inbox and the drain"."""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import zstandard
from sqlalchemy import Float, Integer, Row, Select, Table, bindparam, delete, func, null, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache import records
from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.records import RunRecord
from jaxcache.service.catalog import coordination
from jaxcache.service.catalog.database import USAGE, Catalog, dialect_insert
from jaxcache.service.catalog.models import InboxRow, RunRow, table_of
from jaxcache.service.metrics import REPORT, Metrics
from jaxcache.service.reports.ingest.fold import Folded, Item, fold
from jaxcache.service.reports.records import malformed
from jaxcache.service.state import State

log = logging.getLogger("jaxcache.service")

#: Told of the misses a drain's pass explained for the first time, by cause, once committed.
OnMisses = Callable[[Mapping[str, int]], None]
#: Records one pass folds at most: other writers of the cache (rescans, prunes) wait for its transaction.
PASS_RECORDS = 256


class InboxFullError(JaxcacheError):
    """The inbox holds its configured limit of records; ``retry_after_s``: about when the drain will have made room
    (web/errors.py answers ``http_status`` with Retry-After)."""

    http_status = 503

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Accepted:
    """What putting one record into the inbox did."""

    cache: str
    run_id: str
    process_index: int
    keys: int
    stale: bool  # a newer version of this record was already accepted: nothing changed


@dataclass(slots=True)
class Drained(Folded):
    """:class:`Folded`'s figures summed over a drain's passes, and the rows it dropped (they no longer parse, or the
    catalog refused them), by source."""

    malformed: Counter[str] = field(default_factory=Counter)


def accept(catalog: Catalog, cache: str, record: RunRecord, body: bytes, *, source: str = REPORT,
           name: str | None = None, limit: int | None = None) -> Accepted:
    """Store ``record`` (parsed from ``body``) in ``cache``'s inbox, zstd-compressed, unless a newer version is held.
    InvalidInputError for a key listed twice; InboxFullError, storing nothing, when ``limit`` records wait."""
    check_keys([u.key for u in record.keys])
    row = {"cache": cache, "run_id": record.run_id, "process_index": record.process_index,
           "updated_s": record.updated_at, "source": source, "record": name,
           "body": zstandard.ZstdCompressor(level=1).compress(body), "received_s": time.time()}
    if catalog.dialect == "postgresql":
        # One statement in autocommit: two round trips, where a transaction of three statements took six.
        with catalog.statements() as conn:
            held, kept = conn.execute(_accept(limit is not None), {**row, "limit": limit}).one()
    else:
        held, kept = _accept_in_transaction(catalog, row, limit)
    if held is not None and limit is not None and held >= limit:
        raise InboxFullError(f"{held} run records are waiting for the catalog (the inbox holds at most "
                             f"JAXCACHE_REPORT_INBOX={limit}): try again in a few seconds; the record file "
                             "reaches the catalog at the next rescan anyway", retry_after_s=5)
    return Accepted(cache, record.run_id, record.process_index, len(record.keys), not kept)


def _accept_in_transaction(catalog: Catalog, row: dict[str, Any], limit: int | None) -> tuple[int | None, bool]:
    """SQLite: :func:`_accept`'s reads and upsert in one write transaction; the records waiting (None without a
    limit), and whether ``row`` was stored."""
    with catalog.writing(row["cache"]) as s:
        conn = s.connection()
        ids = {n: row[n] for n in ("cache", "run_id", "process_index")}
        folded = conn.execute(_folded(), ids).scalar_one_or_none()
        held = conn.execute(_waiting()).scalar_one() if limit is not None else None
        if (held is not None and limit is not None and held >= limit) or (
                folded is not None and folded > row["updated_s"]):
            return held, False
        return held, conn.execute(_upsert(catalog.dialect), row).first() is not None


def check_keys(keys: Sequence[str]) -> None:
    """Refuse (InvalidInputError) a record the catalog cannot store: one that names a key twice."""
    if len(set(keys)) == len(keys):
        return
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise InvalidInputError(f"run record lists key {key!r} twice: one entry per key")
        seen.add(key)


def body_of(stored: bytes) -> bytes:
    """The record's JSON, as an inbox row stores it; InvalidInputError if it does not decompress."""
    try:
        # A decompressor per call: they are not thread-safe.
        return zstandard.ZstdDecompressor().decompress(stored)
    except zstandard.ZstdError as exc:
        raise InvalidInputError(f"the inbox row does not decompress: {exc}") from None


def waiting(catalog: Catalog) -> int:
    """Records in the inbox, of every cache."""
    with catalog.statements() as conn:
        return int(conn.execute(_waiting()).scalar_one())


def caches_waiting(catalog: Catalog) -> list[str]:
    """The caches with records in the inbox."""
    with catalog.statements() as conn:
        return sorted(conn.execute(select(InboxRow.cache).distinct()).scalars())


def ingest(catalog: Catalog, cache: str, record: RunRecord, *, source: str = REPORT, name: str | None = None,
           root: str | None = None, on_misses: OnMisses | None = None) -> Accepted:
    """Accept ``record`` and drain ``cache``: folded before this returns; ``stale`` also when the fold found it
    older than the catalog's. InvalidInputError for a record the catalog cannot hold."""
    accepted = accept(catalog, cache, record, record.to_json(), source=source, name=name)
    drained = drain(catalog, cache, root=root, on_misses=on_misses)
    if drained.malformed:
        raise InvalidInputError(f"run record {record.run_id}-p{record.process_index}: the catalog refused it (the "
                                "service's log says why)")
    return replace(accepted, stale=accepted.stale or (drained.stale > 0 and not drained.fresh))


def drain(catalog: Catalog, cache: str, *, root: str | None = None, on_misses: OnMisses | None = None) -> Drained:
    """Fold every record of ``cache`` in the inbox, a pass at a time; ``on_misses`` is told of each committed pass's
    misses explained for the first time. A pass the catalog refuses is folded again a record at a time, and the record
    it refuses is dropped and counted: one record never stops the others."""
    out = Drained()
    while True:
        try:
            taken = _pass(catalog, cache, out, root=root, on_misses=on_misses)
        except malformed.REFUSALS:
            taken = _pass(catalog, cache, out, root=root, on_misses=on_misses, one_at_a_time=True)
        if taken < PASS_RECORDS:
            break
    return out


def _pass(catalog: Catalog, cache: str, out: Drained, *, root: str | None, on_misses: OnMisses | None,
          one_at_a_time: bool = False) -> int:
    """Claim, fold and delete up to PASS_RECORDS rows of ``cache`` in one write transaction (one per row when
    ``one_at_a_time``); the rows taken."""
    taken = 0
    limit = 1 if one_at_a_time else PASS_RECORDS
    for _ in range(PASS_RECORDS if one_at_a_time else 1):
        with catalog.writing(cache) as s:
            rows = s.execute(_claim(catalog, cache, limit)).all()
            if not rows:
                break
            folded, dropped = _fold_rows(catalog, s, cache, rows, root=root, one_at_a_time=one_at_a_time)
            _delete(s.connection(), cache, rows)
        for row, exc in dropped:  # deleted for good: counted once (a pass refused and taken again drops them anew)
            _dropped(cache, row, exc, out)
        if on_misses is not None and folded.misses:  # committed: counted once
            on_misses(folded.misses)
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
            record = _record_of(body_of(bytes(row.body)))
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
    """An inbox row's record, checked when it was accepted: read for folding alone, unless another version of the
    service accepted it (another schema), then parsed in full."""
    try:
        return records.parse_figures(body)  # only a record of the current schema (records.SCHEMA) decodes here
    except InvalidInputError:
        return records.parse(body)


def _delete(conn: Connection, cache: str, rows: Sequence[Row]) -> None:
    """Delete the versions of the records in ``rows`` from the inbox (a newer version stays for the next pass)."""
    done = delete(InboxRow).where(InboxRow.cache == cache, InboxRow.run_id == bindparam("run_id"),
                                  InboxRow.process_index == bindparam("process_index"),
                                  InboxRow.updated_s == bindparam("updated_s"))
    conn.execute(done, [{"run_id": r.run_id, "process_index": r.process_index, "updated_s": r.updated_s}
                        for r in rows])


def _dropped(cache: str, row: Row, exc: Exception, out: Drained) -> None:
    log.warning("run record %s-p%d of %s dropped from the inbox: %s", row.run_id, row.process_index, cache,
                malformed.reason(exc))
    out.malformed[row.source] += 1


def drain_all(state: State) -> int:
    """Drain every cache with records waiting, configured here or not; the records that changed the catalog."""
    fresh = 0
    for name in caches_waiting(state.catalog):
        state.loops.on_cache(name)
        # Another replica's cache, or one dropped from the settings, too: rows nobody drains would fill the inbox.
        storage = state.storages.get(name)
        drained = drain(state.catalog, name, root=storage.url if storage is not None else None,
                        on_misses=partial(count_misses, state.metrics, name))
        note_folded(state, name, drained.fresh, sum(drained.misses.values()), drained.malformed,
                    configured=storage is not None)
        fresh += sum(drained.fresh.values())
    return fresh


def count_misses(metrics: Metrics, cache: str, counts: Mapping[str, int]) -> None:
    """Count in the metrics misses explained for the first time, by cause (a drain's ``on_misses``)."""
    for cause, n in counts.items():
        metrics.misses.labels(cache, cause).inc(n)


def note_folded(state: State, name: str, fresh: Mapping[str, int], misses: int, dropped: Mapping[str, int], *,
                configured: bool = True) -> None:
    """Count a drain's folded and dropped records, by source, and (for a cache served here) move its usage change
    count."""
    for source, n in fresh.items():
        state.metrics.reports_ingested.labels(name, source).inc(n)
    for source, n in dropped.items():
        state.metrics.reports_malformed.labels(source).inc(n)
    if configured and (fresh or misses):
        state.generations.bump(name, USAGE)  # hits, last use, first writers and misses moved


# Built once: building a statement cost more than running it.
@functools.cache
def _waiting() -> Select:
    return select(func.count()).select_from(InboxRow)


@functools.cache
def _folded() -> Select:
    return select(RunRow.updated_s).where(RunRow.cache == bindparam("cache"), RunRow.run_id == bindparam("run_id"),
                                          RunRow.process_index == bindparam("process_index"))


def _claim(catalog: Catalog, cache: str, limit: int) -> Select:
    q = (select(InboxRow.run_id, InboxRow.process_index, InboxRow.updated_s, InboxRow.source, InboxRow.record,
                InboxRow.body)
         .where(InboxRow.cache == cache).order_by(InboxRow.received_s).limit(limit))
    # PostgreSQL: replicas draining at once never take the same row.
    return q.with_for_update(skip_locked=True) if catalog.dialect == "postgresql" else q


_INBOX = table_of(InboxRow)


@functools.cache
def _upsert(dialect: str) -> Any:
    table = _INBOX
    insert = dialect_insert(dialect, table)
    insert = insert.values({c.name: bindparam(c.name) for c in table.columns})
    return _newest(insert, table)


def _newest(insert: Any, table: Table) -> Any:
    """``insert`` as an upsert that keeps the newest version of a process's record; RETURNING what it stored."""
    return insert.on_conflict_do_update(
        index_elements=["cache", "run_id", "process_index"],
        set_={c.name: insert.excluded[c.name] for c in table.columns if not c.primary_key},
        where=insert.excluded.updated_s >= table.c.updated_s,
    ).returning(table.c.cache)


@functools.cache
def _accept(limited: bool) -> Select:
    """PostgreSQL: the upsert, made only if the run tables hold no newer version and (when ``limited``) fewer than
    ``limit`` records wait; the records waiting (None unless ``limited``) and whether it stored the row."""
    table = _INBOX
    found = select(_folded().scalar_subquery().label("folded"),
                   (_waiting().scalar_subquery() if limited else null()).label("held")).cte("found")
    room = [found.c.held < bindparam("limit", type_=Integer)] if limited else []
    values = select(*(bindparam(c.name, type_=c.type) for c in table.columns)).select_from(found).where(
        or_(found.c.folded.is_(None), found.c.folded <= bindparam("updated_s", type_=Float)), *room)
    kept = _newest(dialect_insert("postgresql", table).from_select([c.name for c in table.columns], values),
                   table).cte("kept")
    # Each stored row notifies the drains at commit (catalog/coordination.py), in the same statement.
    notified = select(coordination.notify(kept.c.cache)).select_from(kept).subquery()
    return select(found.c.held, select(func.count()).select_from(notified).scalar_subquery() > 0)
