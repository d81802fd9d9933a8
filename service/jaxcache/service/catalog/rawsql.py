"""Core statements compiled once per shape and run on the driver's own cursor, for the hottest paths: listings,
and the rows a report ingestion writes.

SQLAlchemy's statement cache still builds the expression and processes every result row each time: on a page of
100 entries that is most of a request's cost. Here the expression is built and compiled once per *shape* (which
filters, which sort), values go in as bound parameters, and rows come back as the driver's plain tuples. Only for
statements whose columns need no conversion beyond what the caller does itself (SQLite gives Boolean as 0/1; JSON
columns take their text).
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    Integer,
    LargeBinary,
    String,
    Table,
    any_,
    bindparam,
    insert,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    positions: tuple[str, ...] | None  # bind names in order for positional drivers (SQLite); None: named (psycopg)
    defaults: dict  # values the expression itself binds (literals such as kind = 'entry')


#: Written without a lock: a race compiles a shape twice, and either result is right.
_cache: dict[tuple[str, Hashable], _Compiled] = {}


def _compile(conn: Connection, shape: Hashable, build: Callable[[], ClauseElement]) -> _Compiled:
    key = (conn.dialect.name, shape)
    found = _cache.get(key)
    if found is None:
        compiled = cast(SQLCompiler, build().compile(dialect=conn.dialect))  # a statement's compiler
        if "POSTCOMPILE" in compiled.string:  # an expanding IN or a literal LIMIT: not for this path
            raise ValueError(f"statement of shape {shape!r} needs per-execution compilation")
        # Only literal values are defaults: a parameter the caller must give and did not is a KeyError, not NULL.
        literal = {name: value for name, value in compiled.params.items() if not compiled.binds[name].required}
        found = _Compiled(compiled.string, tuple(compiled.positiontup or ()) if compiled.positional else None,
                          literal)
        _cache[key] = found
    return found


@contextlib.contextmanager
def _executed(conn: Connection, shape: Hashable, build: Callable[[], ClauseElement],
              params: Mapping[str, object], binary: bool = False) -> Iterator[Any]:
    """The driver's cursor, the statement ``build()`` returns (built once for each ``shape``) executed on it with
    ``params`` bound by name; closed after the block. ``binary``: PostgreSQL sends the rows in its binary format."""
    c = _compile(conn, shape, build)
    values = {**c.defaults, **params}
    args = values if c.positions is None else tuple(values[n] for n in c.positions)
    cursor = conn.connection.cursor()
    try:
        if binary and conn.dialect.name == "postgresql":
            cursor.execute(c.sql, args, binary=True)  # type: ignore[call-arg]  # psycopg's
        else:
            cursor.execute(c.sql, args)
        yield cursor
    finally:
        cursor.close()


def fetch(conn: Connection, shape: Hashable, build: Callable[[], ClauseElement],
          params: Mapping[str, object], *, binary: bool = False) -> list[tuple]:
    """Rows of the statement ``build()`` returns (built once for each ``shape``), with ``params`` bound by name.
    ``binary``: rows come in PostgreSQL's binary format (for columns of bytes: as text, each was hex-encoded by the
    server and decoded here); only for columns whose values load the same either way."""
    with _executed(conn, shape, build, params, binary) as cursor:
        return cast(list[tuple], cursor.fetchall())  # both drivers give a list; the DBAPI stub says Sequence


#: SQLite's IN lists are bound as this many parameters (the values repeated up to it): a few compiled shapes serve
#: any length. PostgreSQL takes one array (``= ANY``): planned for every execution here, an IN list of 512
#: parameters took 4 ms to plan.
IN_SIZES = (8, 32, 128, 512)

Within = Callable[[ColumnElement[Any]], ColumnElement[bool]]


def fetch_in(conn: Connection, shape: Hashable, build: Callable[[Within], ClauseElement],
             params: Mapping[str, object], values: Sequence[object], *, binary: bool = False) -> list[tuple]:
    """Rows of ``build(within)``, a statement that selects with ``within(column)``: that ``column`` is one of
    ``values`` (in chunks of at most the largest of IN_SIZES). ``binary``: as :func:`fetch`'s."""
    out: list[tuple] = []
    most = IN_SIZES[-1]
    for i in range(0, len(values), most):
        chunk = list(values[i : i + most])
        if conn.dialect.name == "postgresql":
            out += fetch(conn, (shape, "any"), functools.partial(build, _any), {**params, "in_values": chunk},
                         binary=binary)
            continue
        size = next(n for n in IN_SIZES if n >= len(chunk))
        chunk += [chunk[-1]] * (size - len(chunk))
        names = [f"in_{j}" for j in range(size)]
        out += fetch(conn, (shape, size), functools.partial(build, functools.partial(_in, names)),
                     {**params, **dict(zip(names, chunk, strict=True))})
    return out


def _in(names: list[str], column: ColumnElement[Any]) -> ColumnElement[bool]:
    return column.in_([bindparam(n) for n in names])


def _any(column: ColumnElement[Any]) -> ColumnElement[bool]:
    return column == any_(bindparam("in_values", type_=ARRAY(column.type)))


def batches(conn: Connection, shape: Hashable, build: Callable[[], ClauseElement], params: Mapping[str, object], *,
            size: int = 10_000) -> Iterator[list[tuple]]:
    """The rows :func:`fetch` gives, ``size`` at a time: a caller that keeps objects made from a million rows need
    not hold the rows as well."""
    with _executed(conn, shape, build, params) as cursor:
        while rows := cursor.fetchmany(size):
            yield cast(list[tuple], rows)


def execute_many(conn: Connection, shape: Hashable, build: Callable[[], ClauseElement],
                 params: Sequence[Mapping[str, object]]) -> None:
    """Run the INSERT or UPDATE ``build()`` returns (built once for each ``shape``) once per mapping of
    ``params``, bound by name: SQLAlchemy's own executemany processes every value of every row in Python first,
    which was a third of a report's ingestion."""
    if not params:
        return
    c = _compile(conn, shape, build)
    if c.positions is None:
        rows: list = [{**c.defaults, **p} for p in params]
    else:
        positions, defaults = c.positions, c.defaults
        try:  # every value given (insert_rows): the tuples built in C, not a generator per row
            rows = list(map(operator.itemgetter(*positions), params)) if len(positions) > 1 else [
                (p[positions[0]],) for p in params]
        except KeyError:
            rows = [tuple(p[n] if n in p else defaults[n] for n in positions) for p in params]
    cursor = conn.connection.cursor()
    try:
        cursor.executemany(c.sql, rows)
    finally:
        cursor.close()


def upsert_many(conn: Connection, table: Table, rows: Sequence[Mapping[str, object]]) -> None:
    """Insert ``rows`` (every column of ``table`` each, values as the driver takes them), each replacing the row
    with its primary key if there is one (of rows with the same key, the last): ``INSERT ... ON CONFLICT DO
    UPDATE``, on either backend; on PostgreSQL one statement for all of them (``unnest``, as :func:`update_rows`)."""
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        pk = [c.name for c in table.primary_key.columns]
        last = {tuple(r[k] for k in pk): r for r in rows}  # one statement may not update a row twice
        names = [c.name for c in table.columns]
        sql = (f'INSERT INTO "{table.name}" (' + ", ".join(f'"{n}"' for n in names) + ") SELECT * FROM "
               + _unnest(table, names) + " ON CONFLICT (" + ", ".join(f'"{k}"' for k in pk) + ") DO UPDATE SET "
               + ", ".join(f'"{n}" = excluded."{n}"' for n in names if n not in pk))
        _run_arrays(conn, table, sql, names, list(last.values()))
        return

    def build() -> ClauseElement:
        pk = [c.name for c in table.primary_key.columns]
        statement = sqlite.insert(table).values({c.name: bindparam(c.name) for c in table.columns})
        return statement.on_conflict_do_update(
            index_elements=pk, set_={c.name: statement.excluded[c.name] for c in table.columns if c.name not in pk})

    execute_many(conn, ("upsert", table.name), build, rows)


def update_rows(conn: Connection, table: Table, keys: Sequence[str], columns: Sequence[str],
                rows: Sequence[Mapping[str, object]]) -> None:
    """Set ``columns`` of the rows of ``table`` whose ``keys`` columns have each of ``rows``' values (each mapping
    has both, values as the driver takes them). One statement on PostgreSQL, the values bound as one array per
    column (``unnest``): run once per row, each UPDATE was planned again, which was most of its server time; a
    prepared UPDATE run for each row on SQLite."""
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        execute_many(conn, ("update", table.name, tuple(keys), tuple(columns)), lambda: update(table).where(
            *(table.c[k] == bindparam(f"k_{k}") for k in keys)).values({c: bindparam(f"v_{c}") for c in columns}),
            [{**{f"k_{k}": r[k] for k in keys}, **{f"v_{c}": r[c] for c in columns}} for r in rows])
        return
    names = [*keys, *columns]
    collated = {n: ' COLLATE "C"' if isinstance(table.c[n].type, String) else "" for n in keys}
    sql = (f'UPDATE "{table.name}" AS t SET ' + ", ".join(f'"{c}" = v."{c}"' for c in columns)
           + f" FROM {_unnest(table, names)} AS v(" + ", ".join(f'"{n}"' for n in names) + ") WHERE "
           + " AND ".join(f't."{k}" = v."{k}"{collated[k]}' for k in keys))
    _run_arrays(conn, table, sql, names, rows)


def _unnest(table: Table, names: Sequence[str]) -> str:
    """``unnest(...)`` of one array parameter (``a_<name>``) per column of ``names``: rows of those columns."""
    return "unnest(" + ", ".join(f"%(a_{n})b::{_pg_array(table.c[n])}" for n in names) + ")"


def _run_arrays(conn: Connection, table: Table, sql: str, names: Sequence[str],
                rows: Sequence[Mapping[str, object]]) -> None:
    """Run ``sql`` with one array per column of ``names`` (``a_<name>``), in PostgreSQL's binary format: as text,
    psycopg quoted and escaped every value in Python (bytes hex-encoded), a third of a storm's writer, and the
    server parsed them back. A binary array holds one type: a float column's whole numbers are made floats; any
    other mix of types is an error."""
    arrays: dict[str, list] = {}
    for n in names:
        values = [r[n] for r in rows]
        if isinstance(table.c[n].type, Float):  # 0 and 1.5 in one column: one type, exactly
            values = [float(v) if type(v) is int else v for v in values]
        arrays[f"a_{n}"] = values
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]  # psycopg's own
    try:
        cursor.execute(sql, arrays)
    finally:
        cursor.close()


#: The PostgreSQL array type of a column's values, by its type (the first that matches: BigInteger is an Integer).
_PG_ARRAYS: tuple[tuple[type, str], ...] = (
    (String, "text[]"), (BigInteger, "bigint[]"), (Integer, "integer[]"), (Float, "double precision[]"),
    (JSON, "json[]"), (Boolean, "boolean[]"), (LargeBinary, "bytea[]"),
)


def _pg_array(column: ColumnElement[Any]) -> str:
    found = next((name for kind, name in _PG_ARRAYS if isinstance(column.type, kind)), None)
    if found is None:
        raise TypeError(f"{column}: no array type for {column.type!r}")
    return found


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, object]]) -> None:
    """Insert ``rows`` (every column of ``table`` each, values as the driver takes them) in ``conn``'s
    transaction: COPY on PostgreSQL, where one INSERT a row cost 50 us of the server's time a row; a prepared
    INSERT run for each on SQLite."""
    if not rows:
        return
    names = [c.name for c in table.columns]
    if conn.dialect.name != "postgresql":
        execute_many(conn, ("insert", table.name), lambda: insert(table).values(
            {n: bindparam(n, type_=table.c[n].type) for n in names}), rows)
        return
    columns = ", ".join(f'"{n}"' for n in names)
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]  # psycopg's own
    try:
        with cursor.copy(f'COPY "{table.name}" ({columns}) FROM STDIN') as copy:
            for row in rows:
                copy.write_row([row[n] for n in names])
    finally:
        cursor.close()
