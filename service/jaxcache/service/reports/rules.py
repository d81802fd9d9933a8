"""The rules that make the catalog's figures from what processes did with keys, each written once, as SQL over the
rows it applies to (docs/service.md, "Run records"). :mod:`.aggregates` builds its statements from these.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, literal, or_
from sqlalchemy.sql.elements import KeyedColumnElement

from jaxcache.records import COMPILED, HIT, JOB, WRITE

Col = ColumnElement[Any]


def used_hits(kind: Col, hits: Col) -> Col:
    """The hits that count as use of a key: a job's. A warm-up's run is not use, and its verify run hits every key
    the warm-up just wrote; counted, they would make a warm-up "hit since" itself and keep its entries from LRU
    prunes. Their writes still count (a warm-up is often a key's first writer)."""
    return case((kind == JOB, hits), else_=literal(0))


def saved(kind: Col, hits: Col, retrieval_s: Col, jax_saved_s: Col, measure: Col) -> Col:
    """Seconds one process's hits of a key saved: what its first writer measured compiling it (``measure``), once
    per hit, less the seconds the hits spent loading; JAX's own figure (never below 0) where the catalog knows no
    measure, or where loading took longer."""
    used = used_hits(kind, hits)
    ours = used * measure - retrieval_s
    return case(
        (used == 0, literal(0.0)),
        (and_(measure.is_not(None), ours > 0), ours),
        (jax_saved_s > 0, jax_saved_s),
        else_=literal(0.0),
    )


def wrote(event: Col, writes: Col) -> Col:
    """Whether a process wrote the key."""
    return or_(writes > 0, event == WRITE)


def write_at(event: Col, writes: Col, first_at: Col, started_s: Col) -> Col:
    """When a process wrote the key: its first use of it, else its start; NULL: it did not write it."""
    return case((wrote(event, writes), func.coalesce(func.nullif(first_at, 0.0), started_s)))


def hit_at(kind: Col, hits: Col, first_at: Col, last_at: Col) -> Col:
    """When a process last hit the key in a way that counts as use; NULL: it never did."""
    return case((used_hits(kind, hits) > 0, func.nullif(func.coalesce(func.nullif(last_at, 0.0), first_at), 0.0)))


def is_miss(kind: Col, event: Col) -> Col:
    """A job's process compiled the key: the cache did not give it (jaxcache.explain.from_root.is_miss)."""
    return and_(kind == JOB, event.in_([WRITE, COMPILED]))


def event_rank(event: Col) -> Col:
    """How informative a process's event is: write 2, compiled 1, hit 0. A row keeps its processes' greatest."""
    return case((event == WRITE, 2), (event == COMPILED, 1), else_=0)


def event_of(rank: Col) -> Col:
    """The event of a rank (:func:`event_rank`)."""
    return case((rank == 2, literal(WRITE)), (rank == 1, literal(COMPILED)), else_=literal(HIT))


def most_informative(event: Col) -> Col:
    """The aggregate of processes' events a row keeps: write, else compiled, else hit."""
    return event_of(func.max(event_rank(event)))


def first_writer(partition: list[KeyedColumnElement[Any]], at: Col, *ties: Col) -> Col:
    """1 on the row of each ``partition`` that wrote the key first: the earliest write time, then ``ties`` (run id,
    process index), so every replica and the CLI pick the same writer whatever order records arrive in. Rows that
    did not write (``at`` NULL) come last."""
    return func.row_number().over(partition_by=partition, order_by=[at.asc().nulls_last(), *ties])
