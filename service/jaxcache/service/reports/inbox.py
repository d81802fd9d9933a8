"""The report inbox: where every run record enters the catalog, POSTed or read from its file by a rescan.

A record is stored whole, as the JSON it came as, zstd-compressed (a final record of 200 keys is 210 KB of JSON,
26 KB compressed, and writing then deleting the plain text was most of an inbox row's cost), in one short
transaction: an upsert on (cache, run, process) that keeps the newest version (a record is rewritten while its
process runs, its counts totals so far). The drain (:mod:`.drain`) folds what waits here into the run tables.
docs/service.md, "The report inbox and the drain".
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zstandard
from sqlalchemy import Float, Integer, Select, Table, bindparam, func, null, or_, select

from jaxcache.errors import InvalidInputError
from jaxcache.records import RunRecord
from jaxcache.service.catalog import coordination
from jaxcache.service.catalog.database import Catalog, dialect_insert
from jaxcache.service.catalog.models import InboxRow, RunRow, table_of
from jaxcache.service.metrics import SOURCES
from jaxcache.service.web.errors import InboxFullError

#: Where a record came from (runs.source, inbox rows): read from its file by a rescan, or POSTed.
STORAGE, REPORT = SOURCES


def body_of(stored: bytes) -> bytes:
    """The record's JSON, as an inbox row stores it; InvalidInputError if it does not decompress."""
    try:
        # A (de)compressor object per call: they are not thread-safe, and requests store records in parallel.
        return zstandard.ZstdDecompressor().decompress(stored)
    except zstandard.ZstdError as exc:
        raise InvalidInputError(f"the inbox row does not decompress: {exc}") from None


@dataclass(frozen=True, slots=True)
class Accepted:
    """What putting one record into the inbox did."""

    cache: str
    run_id: str
    process_index: int
    keys: int
    stale: bool  # a newer version of this record was already accepted: nothing changed


def waiting(catalog: Catalog) -> int:
    """Records in the inbox, of every cache."""
    with catalog.side_statements() as conn:
        return int(conn.execute(select(func.count()).select_from(InboxRow)).scalar_one())


def waiting_by_cache(catalog: Catalog) -> dict[str, int]:
    """Records in the inbox, by cache."""
    with catalog.side_statements() as conn:
        return {c: int(n) for c, n in conn.execute(select(InboxRow.cache, func.count()).group_by(InboxRow.cache))}


def accept(catalog: Catalog, cache: str, record: RunRecord, body: bytes, *, source: str = REPORT,
           name: str | None = None, limit: int | None = None) -> Accepted:
    """Put ``record`` (parsed from ``body``, so valid) into the inbox of ``cache``, unless a newer version of it is
    in the inbox or in the run tables already. Raises :class:`InvalidInputError` for a record the drain could not
    fold (a key listed twice), and :class:`InboxFullError` when ``limit`` records already wait, storing nothing."""
    check_keys([u.key for u in record.keys])
    row = {"cache": cache, "run_id": record.run_id, "process_index": record.process_index,
           "updated_s": record.updated_at, "source": source, "record": name,
           "body": zstandard.ZstdCompressor(level=1).compress(body), "received_s": time.time()}
    if catalog.dialect == "postgresql":
        # One statement, its own transaction: two round trips with the pool's ping, where a transaction of the
        # three statements below took six, and a process stores one record at a time (reports/route.py).
        with catalog.side_statements() as conn:
            held, kept = conn.execute(_accept(limit is not None), {**row, "limit": limit}).one()
    else:
        held, kept = _accept_in_transaction(catalog, row, limit)
    if held is not None and limit is not None and held >= limit:
        raise InboxFullError(f"{held} run records are waiting for the catalog (the inbox holds at most "
                             f"JAXCACHE_REPORT_INBOX={limit}): try again in a few seconds; the record file "
                             "reaches the catalog at the next rescan anyway", retry_after_s=5)
    return Accepted(cache, record.run_id, record.process_index, len(record.keys), not kept)


def _accept_in_transaction(catalog: Catalog, row: dict[str, Any], limit: int | None) -> tuple[int | None, bool]:
    """What :func:`_accept`'s statement does, in a transaction of its reads and its upsert: the records waiting
    (None without a limit), and whether ``row`` was stored."""
    ids = {n: row[n] for n in ("cache", "run_id", "process_index")}
    # Where the inbox is a database of its own, what the run tables hold is read before its write lock is taken:
    # the two are never one transaction there, and the lock is held for the inbox's statements alone.
    folded = _folded_apart(catalog, ids) if catalog.side_apart else None
    with catalog.side_write() as s:
        conn = s.connection()
        if not catalog.side_apart:
            folded = conn.execute(_folded(), ids).scalar_one_or_none()
        held = conn.execute(_waiting()).scalar_one() if limit is not None else None
        if (held is not None and limit is not None and held >= limit) or (
                folded is not None and folded > row["updated_s"]):
            return held, False
        return held, conn.execute(_upsert(catalog.dialect), row).first() is not None


def _folded_apart(catalog: Catalog, ids: dict[str, Any]) -> float | None:
    """The ``updated_s`` of the process's record the run tables hold (None: none), where the inbox is apart."""
    with catalog.reader() as conn:
        return conn.execute(_folded(), ids).scalar_one_or_none()


# Built once: building a statement cost more than running it.
@functools.cache
def _waiting() -> Select:
    return select(func.count()).select_from(InboxRow)


@functools.cache
def _folded() -> Select:
    return select(RunRow.updated_s).where(RunRow.cache == bindparam("cache"), RunRow.run_id == bindparam("run_id"),
                                          RunRow.process_index == bindparam("process_index"))


@functools.cache
def _upsert(dialect: str) -> Any:
    table = table_of(InboxRow)
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
    """PostgreSQL: the upsert, made only if the run tables hold no newer version of the process's record and (when
    ``limited``) fewer than ``limit`` records wait; the records waiting (None unless ``limited``), and whether it
    stored the row, which then notifies the drains (catalog/coordination.py)."""
    table = table_of(InboxRow)
    found = select(_folded().scalar_subquery().label("folded"),
                   (_waiting().scalar_subquery() if limited else null()).label("held")).cte("found")
    room = [found.c.held < bindparam("limit", type_=Integer)] if limited else []
    values = select(*(bindparam(c.name, type_=c.type) for c in table.columns)).select_from(found).where(
        or_(found.c.folded.is_(None), found.c.folded <= bindparam("updated_s", type_=Float)), *room)
    kept = _newest(dialect_insert("postgresql", table).from_select([c.name for c in table.columns], values),
                   table).cte("kept")
    # Each stored row notifies the drains (at commit): the same statement, so accepting stays one round trip.
    notified = select(coordination.notify(kept.c.cache)).select_from(kept).subquery()
    return select(found.c.held, select(func.count()).select_from(notified).scalar_subquery() > 0)


def check_keys(keys: Sequence[str]) -> None:
    """Refuse (InvalidInputError) a record the catalog cannot store: one that names a key twice."""
    if len(set(keys)) == len(keys):
        return
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise InvalidInputError(f"run record lists key {key!r} twice: one entry per key")
        seen.add(key)
