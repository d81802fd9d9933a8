"""The usage rows and per-key aggregates a fold writes, as set-based statements built from the usage rules
(:mod:`jaxcache.usage_rules`) in SQL. docs/service.md, "Run records"."""

from __future__ import annotations

import functools
import operator
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import (
    BindParameter,
    Column,
    ColumnElement,
    Delete,
    Integer,
    MetaData,
    Select,
    Subquery,
    Table,
    Update,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.elements import KeyedColumnElement

from jaxcache import usage_rules
from jaxcache.records import JOB
from jaxcache.service.catalog.database import dialect_insert
from jaxcache.service.catalog.models import (
    AGGREGATES,
    EMPTY,
    EntryRow,
    KeyHistoryRow,
    KeyStatsRow,
    ProcessKeysRow,
    RunRow,
    UsageRow,
    table_of,
)
from jaxcache.service.catalog.usage import (
    SQL,
    credited_measure,
    event_of,
    event_rank,
    hit_at,
    is_miss,
    saved,
    used_hits,
    write_at,
    wrote,
)

T = TypeVar("T")
Col = ColumnElement[Any]

def most_informative(event: Col) -> Col:
    """The aggregate of processes' events a row keeps: write, else compiled, else hit."""
    return event_of(func.max(event_rank(event)))


def first_writer(partition: list[KeyedColumnElement[Any]], at: Col, run_id: Col, process_index: Col) -> Col:
    """1 on the row of each ``partition`` that wrote the key first; rows that did not write (``at`` NULL) come last."""
    order = usage_rules.writer_order(SQL, at, run_id, process_index)
    return func.row_number().over(partition_by=partition, order_by=list(order))


WRITER = tuple(n for n in AGGREGATES if n.startswith("writer_"))
#: The key's platform's own measure: its first job compile (models.Aggregates).
PLATFORM = tuple(n for n in AGGREGATES if n.startswith("platform_"))
#: Keys per statement: bound one parameter each (SQLite allows 32,766 in all).
CHUNK = 1000
#: A usage row's columns that its processes' rows make (all but its texts and explanation).
USAGE = ("cache", "run_id", "key", "job", "kind", "process_index", "processes", "function", "event", "hits",
         "compiles", "writes", "reason", "compile_s", "retrieval_s", "jax_saved_s", "saved_s", "size_bytes",
         "first_at", "last_at", "last_hit_s", "updated_s", "missed", "counted")
#: Those that are sums over the processes, and those that are their least or greatest value.
SUMS = ("processes", "hits", "compiles", "writes", "compile_s", "retrieval_s", "jax_saved_s", "saved_s", "missed")
LEAST, GREATEST = ("process_index", "function", "first_at"), ("reason", "size_bytes", "last_at", "last_hit_s",
                                                               "updated_s")
#: A miss's explanation on its usage row (:mod:`.misses`).
EXPLANATION = ("cause", "differs", "nearest", "fix")

_pk, _runs, _usage, _stats, _history, _entries = (table_of(m) for m in (
    ProcessKeysRow, RunRow, UsageRow, KeyStatsRow, KeyHistoryRow, EntryRow))
_KEYS: BindParameter[Any] = bindparam("b_keys", expanding=True)
_CACHE: BindParameter[str] = bindparam("b_cache")
_GROUP = ("cache", "run_id", "key", "job", "kind")
#: A pass's processes' rows of each key as they were (sign -1) and are (sign 1), aggregated as usage rows are.
_pass = Table("pass_usage", MetaData(), Column("sign", Integer),
              *(Column(n, _usage.c[n].type) for n in USAGE if n != "counted"), prefixes=["TEMPORARY"])
_PASS = [c.name for c in _pass.columns]


def _none(name: str) -> Any:
    """NULL as aggregate column ``name``, typed: PostgreSQL types a union's column from its first two parts, and two
    untyped NULLs make it text."""
    return cast(null(), _stats.c[name].type).label(name)


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _process_run(measure: bool = False) -> Any:
    """Process rows with their run rows and, with ``measure``, their key's aggregates (its platform's and first
    writer's measures)."""
    joined = _pk.join(_runs, and_(_runs.c.cache == _pk.c.cache, _runs.c.run_id == _pk.c.run_id,
                                  _runs.c.process_index == _pk.c.process_index))
    measured = and_(_stats.c.cache == _pk.c.cache, _stats.c.key == _pk.c.key)
    return joined.outerjoin(_stats, measured) if measure else joined


def _saved(kind: Any) -> Any:
    measure = credited_measure(_stats.c.platform_compile_s, _stats.c.writer_compile_s)
    return saved(kind, _pk.c.hits, _pk.c.retrieval_s, _pk.c.jax_saved_s, measure)


def _saved_writer(kind: Any) -> Any:
    """The part of :func:`_saved` credited at the writer's time: a key no job's compile measured yet."""
    return case((_stats.c.platform_compile_s.is_(None), _saved(kind)), else_=0.0)


# --- usage rows -----------------------------------------------------------------------------------------------------


def usage_rows(conn: Connection, cache: str, keys: Sequence[str], *, run_id: str | None = None) -> None:
    """Compute the usage rows of ``keys`` (of run ``run_id``; None: of every run) from their processes' rows, and
    delete those no process has any more."""
    by_run = run_id is not None
    for chunk in chunks(sorted(keys)):
        params = {"b_cache": cache, "b_keys": chunk, "b_run_id": run_id}
        made = len(conn.execute(_usage_upsert(conn.dialect.name, by_run), params).all())
        if conn.execute(_usage_count(by_run), params).scalar_one() > made:  # (rarely: a key no process has now)
            conn.execute(_usage_gone(by_run), params)


def _by_run(by_run: bool, table: Any) -> list[Any]:
    return [table.c.run_id == bindparam("b_run_id")] if by_run else []


@functools.cache
def _usage_upsert(dialect: str, by_run: bool) -> Any:
    rows = usage_of(process_rows(_pk.c.cache == _CACHE, _pk.c.key.in_(_KEYS), *_by_run(by_run, _pk)))
    return usage_upsert(dialect, rows).returning(_usage.c.key)


def process_rows(*where: Any) -> Subquery:
    """The process_keys rows matching ``where``, each with its run's job, kind and record time, and the seconds its
    hits saved (its key's first writer's measure)."""
    p, r = _pk.c, _runs.c
    return (
        select(p.cache, p.run_id, p.key, r.job, r.kind, p.process_index, p.function, p.event, p.hits, p.compiles,
               p.writes, p.reason, p.compile_s, p.retrieval_s, p.jax_saved_s, p.size_bytes, p.first_at, p.last_at,
               r.updated_s, _saved(r.kind).label("saved"))
        .select_from(_process_run(measure=True)).where(*where)
    ).subquery()


def usage_of(rows: Subquery) -> Select:
    """The usage rows (USAGE columns) that ``rows`` (of :func:`process_rows`) make, one per run, key, job and kind."""
    s = rows.c
    values: dict[str, Any] = {
        "cache": s.cache, "run_id": s.run_id, "key": s.key, "job": s.job, "kind": s.kind,
        "process_index": func.min(s.process_index), "processes": func.count(), "function": func.min(s.function),
        "event": most_informative(s.event), "hits": func.sum(s.hits), "compiles": func.sum(s.compiles),
        "writes": func.sum(s.writes), "reason": func.max(s.reason),
        "compile_s": func.coalesce(func.sum(s.compile_s), 0.0), "retrieval_s": func.sum(s.retrieval_s),
        "jax_saved_s": func.sum(s.jax_saved_s), "saved_s": func.sum(s.saved), "size_bytes": func.max(s.size_bytes),
        "first_at": func.coalesce(func.min(func.nullif(s.first_at, 0.0)), 0.0), "last_at": func.max(s.last_at),
        "last_hit_s": func.max(hit_at(s.kind, s.hits, s.first_at, s.last_at)),
        "updated_s": func.max(s.updated_s),
        "missed": func.sum(case((is_miss(s.kind, s.event), 1), else_=0)), "counted": literal(0),
    }
    # WHERE true: SQLite would read the ON of ON CONFLICT as a join's otherwise.
    return select(*(values[n].label(n) for n in USAGE)).where(true()).group_by(*(s[n] for n in _GROUP))


def usage_upsert(dialect: str, rows: Select) -> Any:
    """Upsert ``rows`` (USAGE columns) as usage rows; a row keeps its miss's explanation while what it was made of
    holds, and its count of misses the metric counted."""
    ins = dialect_insert(dialect, _usage).from_select(list(USAGE), rows)
    u, ex = _usage.c, ins.excluded
    # What a miss's explanation was made of (parts and programs: fold's texts drop it).
    same = and_(u.process_index == ex.process_index, u.event == ex.event, u.first_at == ex.first_at,
                u.reason.is_not_distinct_from(ex.reason), is_miss(ex.kind, ex.event))
    kept = {n: case((same, u[n])) for n in EXPLANATION}
    return ins.on_conflict_do_update(
        index_elements=[c.name for c in _usage.primary_key],
        set_={**{n: ex[n] for n in USAGE if n not in (*_GROUP, "counted")}, **kept},
    )


@functools.cache
def _usage_count(by_run: bool) -> Select:
    u = _usage.c
    return select(func.count()).where(u.cache == _CACHE, u.key.in_(_KEYS), *_by_run(by_run, _usage))


@functools.cache
def _usage_gone(by_run: bool) -> Delete:
    u, p = _usage.c, _pk.c
    held = (select(literal(1)).select_from(_process_run())
            .where(p.cache == u.cache, p.run_id == u.run_id, p.key == u.key, _runs.c.job == u.job,
                   _runs.c.kind == u.kind))
    return delete(_usage).where(u.cache == _CACHE, u.key.in_(_KEYS), ~exists(held), *_by_run(by_run, _usage))


# --- usage rows by what a pass changed ------------------------------------------------------------------------------
# A pass costs in proportion to its records, not their runs: sums change by the difference, extremes by the new
# rows' where that can tell; any other row is computed again whole (docs/service.md, "Run records").


def usage_before(conn: Connection, cache: str, processes: Sequence[tuple[str, int]]) -> None:
    """Keep what ``processes`` (run id, index)' rows are now, before the pass replaces them."""
    # Every pass: a pass rolled back (a refused record) took the table made in it with it.
    conn.execute(CreateTable(_pass, if_not_exists=True))
    conn.execute(delete(_pass))
    _aggregate_pass(conn, cache, processes, -1)


def usage_after(conn: Connection, cache: str, processes: Sequence[tuple[str, int]]) -> dict[str, set[str]]:
    """Change the usage rows by what ``processes``' rows are now less what :func:`usage_before` kept; the keys, by
    run, whose rows this cannot change, to compute again from all their processes' rows."""
    _aggregate_pass(conn, cache, processes, 1)
    redo: dict[str, set[str]] = defaultdict(set)
    for run_id, key in conn.execute(_pass_redo()):
        redo[run_id].add(key)
    conn.execute(_pass_apply(conn.dialect.name))
    return redo


def _aggregate_pass(conn: Connection, cache: str, processes: Sequence[tuple[str, int]], sign: int) -> None:
    for params in process_params(processes):
        conn.execute(_pass_rows(sign), {"b_cache": cache, **params})


@functools.cache
def _pass_rows(sign: int) -> Any:
    rows = usage_of(process_rows(_pk.c.cache == _CACHE, *of_processes(_pk))).subquery()
    return insert(_pass).from_select(_PASS, select(literal(sign), *(rows.c[n] for n in _PASS[1:])))


def _pass_changes() -> Any:
    """Each group the pass changed: its usage row (``u``), what the pass's processes had (``o``) and have (``n``),
    what the row becomes where this can say, and whether it cannot."""
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
    values |= {c: summed(c) for c in SUMS}
    values |= {c: extreme(c, operator.lt) for c in LEAST if c != "first_at"}
    values |= {c: extreme(c, operator.gt) for c in GREATEST}
    first_n, first_u = known(n.c.first_at), known(u.c.first_at)
    values["first_at"] = func.coalesce(case((first_u.is_(None), first_n), (first_n.is_(None), first_u),
                                            (first_n < first_u, first_n), else_=first_u), 0.0)
    rank = case((func.coalesce(event_rank(n.c.event), -1) > event_rank(u.c.event), event_rank(n.c.event)),
                else_=event_rank(u.c.event))
    values["event"] = case((u.c.event.is_(None), n.c.event), else_=event_of(rank))
    values["counted"] = literal(0)
    first_o = known(o.c.first_at)
    cannot = and_(o.c.processes.is_not(None), or_(
        u.c.processes.is_(None), summed("processes") <= 0,
        *(lost(c, operator.gt) for c in LEAST if c != "first_at"),
        *(lost(c, operator.lt) for c in GREATEST),
        and_(first_o.is_not(None), first_o == u.c.first_at, or_(first_n.is_(None), first_n > first_o)),
        and_(o.c.event.is_not(None), event_rank(o.c.event) == event_rank(u.c.event),
             func.coalesce(event_rank(n.c.event), -1) < event_rank(o.c.event)),
    ))
    joined = g.outerjoin(o, on(o, o.c.sign == -1)).outerjoin(n, on(n, n.c.sign == 1)).outerjoin(u, on(u))
    return select(*(values[c].label(c) for c in USAGE), cannot.label("cannot")).select_from(joined)


@functools.cache
def _pass_redo() -> Any:
    changed = _pass_changes().subquery()
    return select(changed.c.run_id, changed.c.key).where(changed.c.cannot)


@functools.cache
def _pass_apply(dialect: str) -> Any:
    changed = _pass_changes().subquery()
    # WHERE true as well: SQLite would read the ON of ON CONFLICT as a join's otherwise.
    return usage_upsert(dialect, select(*(changed.c[c] for c in USAGE)).where(~changed.c.cannot, true()))


# --- keys' aggregates -----------------------------------------------------------------------------------------------


def _aggregated(rows: Subquery) -> Select:
    """Per (cache, key) of ``rows`` (AGGREGATES columns; a write's writer columns, a job's compile's platform
    columns, or NULLs): the sums, the latest hit, the first writer and the first job compile."""
    partition = [rows.c.cache, rows.c.key]
    # The first job compile: the earliest, then the least measure and its machine, whatever order rows came in.
    platform_order = [SQL.nulls_last(rows.c.platform_at_s), SQL.nulls_last(rows.c.platform_compile_s),
                      SQL.nulls_last(rows.c.platform_machine)]
    ranked = select(rows, first_writer(partition, rows.c.writer_at_s, rows.c.writer_run,
                                       rows.c.writer_process).label("rank"),
                    func.row_number().over(partition_by=partition, order_by=platform_order).label("platform_rank")
                    ).subquery()
    c = ranked.c
    first = and_(c.rank == 1, c.writer_at_s.is_not(None))
    first_compile = and_(c.platform_rank == 1, c.platform_at_s.is_not(None))
    return (select(c.cache, c.key, func.coalesce(func.sum(c.hits), 0).label("hits"),
                   func.max(c.last_hit_s).label("last_hit_s"),
                   func.coalesce(func.sum(c.saved_s), 0.0).label("saved_s"),
                   *(func.max(case((first, c[n]))).label(n) for n in WRITER),
                   *(func.max(case((first_compile, c[n]))).label(n) for n in PLATFORM))
            .where(true()).group_by(c.cache, c.key))


def _history_of(keys: Any) -> Select:
    h = _history.c
    return select(h.cache, h.key, *(h[n] for n in AGGREGATES)).where(h.cache == _CACHE, h.key.in_(keys))


def _upsert_aggregates(dialect: str, table: Any, rows: Select) -> Any:
    ins = dialect_insert(dialect, table).from_select(["cache", "key", *AGGREGATES], rows)
    return ins.on_conflict_do_update(index_elements=["cache", "key"], set_={n: ins.excluded[n] for n in AGGREGATES})


def _writes(*where: Any) -> Select:
    """The processes that wrote keys, as rows of :func:`_aggregated` (with no hits)."""
    p, r = _pk.c, _runs.c
    return (select(p.cache, p.key, literal(0).label("hits"), literal(None).label("last_hit_s"),
                   literal(0.0).label("saved_s"), r.job.label("writer_job"), p.run_id.label("writer_run"),
                   p.process_index.label("writer_process"), r.host.label("writer_host"),
                   r.topology.label("writer_topology"), r.jax.label("writer_jax"), r.jaxlib.label("writer_jaxlib"),
                   write_at(p.event, p.writes, p.first_at, r.started_s).label("writer_at_s"),
                   p.compile_s.label("writer_compile_s"), r.machine.label("writer_machine"),
                   *(_none(n) for n in PLATFORM))
            .select_from(_process_run()).where(wrote(p.event, p.writes), *where))


def _compiles(*where: Any) -> Select:
    """The job processes that compiled keys and measured it, as rows of :func:`_aggregated` (with no hits): the
    platform's own measures (a warm-up's, on its own machine, are its writer's only)."""
    p, r = _pk.c, _runs.c
    return (select(p.cache, p.key, literal(0).label("hits"), literal(None).label("last_hit_s"),
                   literal(0.0).label("saved_s"), *(_none(n) for n in WRITER),
                   p.compile_s.label("platform_compile_s"), r.machine.label("platform_machine"),
                   func.coalesce(func.nullif(p.first_at, 0.0), r.started_s).label("platform_at_s"))
            .select_from(_process_run())
            # Spelled as ix_process_keys_measured's condition (literally: a bound 0 would not imply it).
            .where(r.kind == JOB, p.compiles > literal_column("0"), p.compile_s.is_not(None), *where))


@functools.cache
def _stats_upsert(dialect: str) -> Any:
    u = _usage.c
    nothing = (_none(n) for n in (*WRITER, *PLATFORM))
    of_usage = (select(u.cache, u.key, used_hits(u.kind, u.hits).label("hits"), u.last_hit_s, u.saved_s,
                       *nothing).where(u.cache == _CACHE, u.key.in_(_KEYS)))
    writes = _writes(_pk.c.cache == _CACHE, _pk.c.key.in_(_KEYS))
    compiles = _compiles(_pk.c.cache == _CACHE, _pk.c.key.in_(_KEYS))
    rows = _aggregated(union_all(of_usage, writes, compiles, _history_of(_KEYS)).subquery())
    return _upsert_aggregates(dialect, _stats, rows).returning(_stats.c.key, _stats.c.hits, _CREDITED)


#: The measure a key's hits are credited with (its platform's, else its first writer's), as key_stats holds it.
_CREDITED = credited_measure(_stats.c.platform_compile_s, _stats.c.writer_compile_s).label("credited")


def key_stats(conn: Connection, cache: str, keys: Sequence[str]) -> set[str]:
    """Compute the aggregates of ``keys`` and copy them onto their entry rows; the keys whose credited measure (their
    platform's, else their first writer's) changed while they have hits (their seconds saved are to be weighed
    again)."""
    moved: set[str] = set()
    for chunk in chunks(sorted(keys)):
        params = {"b_cache": cache, "b_keys": chunk}
        before = dict(conn.execute(_credited_of(), params).all())
        after = conn.execute(_stats_upsert(conn.dialect.name), params).all()
        moved.update(k for k, hits, measure in after if hits and before.get(k) != measure)
        gone = set(chunk) - {k for k, _, _ in after}
        if gone:  # no run record, compacted or not, mentions them any more
            conn.execute(update(_stats).where(_stats.c.cache == cache, _stats.c.key.in_(sorted(gone)))
                         .values(EMPTY))
        conn.execute(_entry_copy(), params)
    return moved


@functools.cache
def _entry_copy() -> Update:
    """Keys' aggregates onto their entry rows; an entry's last use is the newer of storage's and the last hit."""
    e, k = _entries.c, _stats.c
    hit = k.last_hit_s
    return (update(_entries)
            .where(e.cache == _CACHE, e.kind == "entry", e.key.in_(_KEYS), k.cache == e.cache, k.key == e.key)
            .values(**{n: k[n] for n in AGGREGATES},
                    last_used_s=case((and_(hit.is_not(None), hit > e.seen_used_s), hit), else_=e.seen_used_s)))


@functools.cache
def _credited_of() -> Select:
    return select(_stats.c.key, _CREDITED).where(_stats.c.cache == _CACHE, _stats.c.key.in_(_KEYS))


# --- processes' own totals ------------------------------------------------------------------------------------------


def of_processes(table: Any) -> list[Any]:
    """``table``'s rows of some processes of one run (``b_run``, ``b_indexes``): a shape both databases look up in
    the (cache, run, process) index, where (run, process) pairs made SQLite read every process of the cache."""
    return [table.c.run_id == bindparam("b_run"), table.c.process_index.in_(bindparam("b_indexes", expanding=True))]


def process_params(processes: Sequence[tuple[str, int]]) -> Iterator[dict[str, Any]]:
    """The parameters of :func:`of_processes` for ``processes`` (run id, index): a run, and up to CHUNK of its
    processes, at a time."""
    runs: dict[str, list[int]] = defaultdict(list)
    for run_id, index in processes:
        runs[run_id].append(index)
    for run_id, indexes in sorted(runs.items()):
        for chunk in chunks(sorted(indexes)):
            yield {"b_run": run_id, "b_indexes": chunk}


def process_saved(conn: Connection, cache: str, *, processes: Sequence[tuple[str, int]] = (),
                  keys: Sequence[str] = ()) -> None:
    """Compute the seconds saved of ``processes`` (run id, index), and of every process with a row of ``keys``."""
    for params in process_params(processes):
        conn.execute(_process_saved("processes"), {"b_cache": cache, **params})
    for chunk in chunks(sorted(keys)):
        conn.execute(_process_saved("keys"), {"b_cache": cache, "b_keys": chunk})


@functools.cache
def _process_saved(by: str) -> Update:
    r, p = _runs.c, _pk.c
    which = (of_processes(_pk) if by == "processes" else [tuple_(p.run_id, p.process_index).in_(
        select(p.run_id, p.process_index).where(p.cache == _CACHE, p.key.in_(_KEYS)))])
    totals = (select(p.run_id, p.process_index, func.coalesce(func.sum(_saved(r.kind)), 0.0).label("total"),
                     func.coalesce(func.sum(_saved_writer(r.kind)), 0.0).label("writer"))
              .select_from(_process_run(measure=True)).where(p.cache == _CACHE, *which)
              .group_by(p.run_id, p.process_index).subquery())
    return (update(_runs).where(r.cache == _CACHE, r.run_id == totals.c.run_id,
                                r.process_index == totals.c.process_index)
            .values(saved_s=totals.c.total, saved_writer_s=totals.c.writer))


def refresh(conn: Connection, cache: str, keys: Sequence[str]) -> None:
    """Compute every figure of ``keys`` again, in every run (what a new first writer's measure changes)."""
    usage_rows(conn, cache, keys)
    key_stats(conn, cache, keys)
    process_saved(conn, cache, keys=keys)


# --- compaction -----------------------------------------------------------------------------------------------------


def fold_history(conn: Connection, cache: str, processes: Sequence[tuple[str, int]]) -> None:
    """Add what ``processes`` (run id, index) did with their keys to those keys' history (key_history)."""
    conn.execute(_history_upsert(conn.dialect.name), {"b_cache": cache, "b_pairs": list(processes)})


@functools.cache
def _history_upsert(dialect: str) -> Any:
    p, r = _pk.c, _runs.c
    chosen = [p.cache == _CACHE, tuple_(p.run_id, p.process_index).in_(bindparam("b_pairs", expanding=True))]
    nothing = (_none(n) for n in (*WRITER, *PLATFORM))
    done = (select(p.cache, p.key, used_hits(r.kind, p.hits).label("hits"),
                   hit_at(r.kind, p.hits, p.first_at, p.last_at).label("last_hit_s"),
                   _saved(r.kind).label("saved_s"), *nothing)
            .select_from(_process_run(measure=True)).where(*chosen))
    keys = select(p.key).where(*chosen)
    rows = _aggregated(union_all(done, _writes(*chosen), _compiles(*chosen), _history_of(keys)).subquery())
    return _upsert_aggregates(dialect, _history, rows)
