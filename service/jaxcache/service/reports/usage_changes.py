"""A pass's change to its runs' usage rows, in proportion to the pass, not to the runs (docs/service.md, "Run
records").

A usage row sums its run's processes' rows of a key, or keeps their least or greatest value. Folding records
replaces their processes' rows, so the row changes by what those processes' rows were (``before``) and are now
(``after``), each aggregated by the same statement as a whole row (:func:`.aggregates.usage_of`) into a temporary
table: sums by the difference, extremes by the new rows' where the old rows did not hold the row's extreme, or
held it and the new rows hold it still or pass it. Any other row (an extreme its old rows held and the new ones
do not, a row no process has any more) is computed again from all its processes' rows by the caller.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    true,
)
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateTable

from jaxcache.service.catalog.models import ProcessKeysRow, UsageRow, table_of
from jaxcache.service.reports import aggregates, rules

__all__ = ["after", "before"]

_pk, _usage = table_of(ProcessKeysRow), table_of(UsageRow)
_GROUP = ("cache", "run_id", "key", "job", "kind")
#: What a pass's processes' rows of each key were (sign -1) and are (sign 1), aggregated as usage rows are. One per
#: connection, emptied at each pass's start.
_pass = Table("pass_usage", MetaData(), Column("sign", Integer),
              *(Column(n, _usage.c[n].type) for n in aggregates.USAGE if n != "counted"),
              prefixes=["TEMPORARY"])
_NAMES = [c.name for c in _pass.columns]


def before(conn: Connection, cache: str, processes: Sequence[tuple[str, int]]) -> None:
    """Keep what ``processes`` (run id, index)' rows are now, before the pass replaces them."""
    # Every pass: a pass rolled back (a refused record) took the table made in it with it.
    conn.execute(CreateTable(_pass, if_not_exists=True))
    conn.execute(delete(_pass))
    _aggregate(conn, cache, processes, -1)


def after(conn: Connection, cache: str, processes: Sequence[tuple[str, int]]) -> dict[str, set[str]]:
    """Change the usage rows by what ``processes``' rows are now less what :func:`before` kept; the keys, by run,
    whose rows this cannot change and which are to be computed again from all their processes' rows."""
    _aggregate(conn, cache, processes, 1)
    redo: dict[str, set[str]] = defaultdict(set)
    for run_id, key in conn.execute(_redo()):
        redo[run_id].add(key)
    conn.execute(_apply(conn.dialect.name))
    return redo


def _aggregate(conn: Connection, cache: str, processes: Sequence[tuple[str, int]], sign: int) -> None:
    for params in aggregates.process_params(processes):
        conn.execute(_aggregated(sign), {"b_cache": cache, **params})


@functools.cache
def _aggregated(sign: int) -> Any:
    p = _pk.c
    rows = aggregates.usage_of(aggregates.process_rows(p.cache == bindparam("b_cache"),
                                                       *aggregates.of_processes(_pk))).subquery()
    return insert(_pass).from_select(_NAMES, select(literal(sign), *(rows.c[n] for n in _NAMES[1:])))


def _changed() -> Any:
    """Each group the pass changed: its usage row as it is (``u``), what the pass's processes had (``o``) and have
    (``n``), what the row becomes where this can say, and whether it cannot."""
    g = select(*(_pass.c[n] for n in _GROUP)).distinct().subquery("g")
    o, n, u = _pass.alias("o"), _pass.alias("n"), _usage.alias("u")

    def on(t: Any, *more: Any) -> Any:
        return and_(*(t.c[c] == g.c[c] for c in _GROUP), *more)

    def summed(c: str) -> Any:
        return func.coalesce(u.c[c], 0) + func.coalesce(n.c[c], 0) - func.coalesce(o.c[c], 0)

    def extreme(c: str, better: Any) -> Any:
        return case((u.c[c].is_(None), n.c[c]), (n.c[c].is_(None), u.c[c]),
                     (better(n.c[c], u.c[c]), n.c[c]), else_=u.c[c])

    def lost(c: str, worse: Any) -> Any:
        """The old rows held the row's extreme of ``c`` and the new rows do not reach it."""
        return and_(o.c[c].is_not(None), or_(u.c[c].is_(None), and_(
            o.c[c] == u.c[c], or_(n.c[c].is_(None), worse(n.c[c], o.c[c])))))

    known = lambda c: func.nullif(c, 0.0)  # noqa: E731  first_at 0: none known
    values: dict[str, Any] = {c: g.c[c] for c in _GROUP}
    values |= {c: summed(c) for c in aggregates.SUMS}
    values |= {c: extreme(c, lambda a, b: a < b) for c in aggregates.LEAST if c != "first_at"}
    values |= {c: extreme(c, lambda a, b: a > b) for c in aggregates.GREATEST}
    first_n, first_u = known(n.c.first_at), known(u.c.first_at)
    values["first_at"] = func.coalesce(case((first_u.is_(None), first_n), (first_n.is_(None), first_u),
                                             (first_n < first_u, first_n), else_=first_u), 0.0)
    rank = case((func.coalesce(rules.event_rank(n.c.event), -1) > rules.event_rank(u.c.event),
                  rules.event_rank(n.c.event)), else_=rules.event_rank(u.c.event))
    values["event"] = case((u.c.event.is_(None), n.c.event), else_=rules.event_of(rank))
    values["counted"] = literal(0)
    first_o = known(o.c.first_at)
    cannot = and_(o.c.processes.is_not(None), or_(
        u.c.processes.is_(None), summed("processes") <= 0,
        *(lost(c, lambda a, b: a > b) for c in aggregates.LEAST if c != "first_at"),
        *(lost(c, lambda a, b: a < b) for c in aggregates.GREATEST),
        and_(first_o.is_not(None), first_o == u.c.first_at, or_(first_n.is_(None), first_n > first_o)),
        and_(o.c.event.is_not(None), rules.event_rank(o.c.event) == rules.event_rank(u.c.event),
             func.coalesce(rules.event_rank(n.c.event), -1) < rules.event_rank(o.c.event)),
    ))
    joined = (g.outerjoin(o, on(o, o.c.sign == -1)).outerjoin(n, on(n, n.c.sign == 1))
              .outerjoin(u, on(u)))
    return select(*(values[c].label(c) for c in aggregates.USAGE), cannot.label("cannot")).select_from(joined)


@functools.cache
def _redo() -> Any:
    changed = _changed().subquery()
    return select(changed.c.run_id, changed.c.key).where(changed.c.cannot)


@functools.cache
def _apply(dialect: str) -> Any:
    changed = _changed().subquery()
    # WHERE true as well: SQLite would read the ON of ON CONFLICT as a join's otherwise.
    rows = select(*(changed.c[c] for c in aggregates.USAGE)).where(~changed.c.cannot, true())
    return aggregates.usage_upsert(dialect, rows)
