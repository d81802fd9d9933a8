"""The catalog's database: SQLite by default, or PostgreSQL (``postgresql+psycopg://``), which several replicas of
the service share (their locks: :mod:`jaxcache.service.catalog.coordination`). Sessions, write transactions, upserts,
and each cache's change counts."""

from __future__ import annotations

import functools
import logging
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import msgspec
from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Integer,
    Select,
    SmallInteger,
    String,
    Table,
    bindparam,
    case,
    create_engine,
    event,
    literal,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.types import TypeEngine

from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.service.catalog.coordination import ClusterLocks, advisory_key
from jaxcache.service.catalog.models import ChangeCountRow

log = logging.getLogger("jaxcache.service")


class CatalogUnreachableError(JaxcacheError):
    """The catalog database does not answer (or refuses the connection); the message says where and what to check."""


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``: what may be printed or logged."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<not a database URL>"


#: PostgreSQL through psycopg (3), the driver jaxcache-service installs.
_PSYCOPG = "postgresql+psycopg"


def with_driver(url: str) -> URL:
    """``url`` as SQLAlchemy takes it, PostgreSQL's with its driver: a bare ``postgresql://`` gets psycopg, which
    jaxcache-service installs (SQLAlchemy's default before 2.1 is psycopg2, which it does not). ``postgres://``, the
    alias libpq and some hosts' DATABASE_URL use, is SQLAlchemy's "Can't load plugin": refused in one line naming the
    URL to write, rather than taken silently for another spelling."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InvalidInputError(f"catalog database URL {masked(url)!r} is not usable: {exc}") from None
    if parsed.drivername == "postgres" or parsed.drivername.startswith("postgres+"):
        meant = parsed.set(drivername=_PSYCOPG).render_as_string(hide_password=True)
        raise InvalidInputError(f"catalog database URL {masked(url)!r}: SQLAlchemy names PostgreSQL 'postgresql'"
                                f" and its driver here is psycopg: write {meant}")
    return parsed.set(drivername=_PSYCOPG) if parsed.drivername == "postgresql" else parsed


def unreachable(url: URL, exc: OperationalError) -> str:
    """One line on a catalog that does not answer: which server, what it said, what to check."""
    said = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc).splitlines()[0]
    where = f"{url.host or 'localhost'}:{url.port or 5432}" if url.get_backend_name() == "postgresql" else url.database
    return (f"cannot reach the catalog database at {where} (database {url.database!r} as {url.username!r}): {said}."
            " Check that the server runs and is reachable from here, and JAXCACHE_DB's host, port, user and password")


class Catalog:
    """Owns the engine, hands out sessions, and knows the catalog's cross-replica locks."""

    def __init__(self, url: str, *, migrate: bool = True, snapshot_dir: str | os.PathLike[str] | None = None) -> None:
        self.url = url
        # Where rescans keep their listing for a restarted process (rescan/snapshots.py); None: in memory only.
        self.snapshot_dir = snapshot_dir
        shown = masked(url)
        if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
            directory = os.path.dirname(url[len("sqlite:///") :])
            if directory:
                try:
                    os.makedirs(directory, exist_ok=True)
                except OSError as exc:
                    raise InvalidInputError(f"catalog database URL {shown!r}: cannot make its directory "
                                            f"{directory}: {exc.strerror or exc}") from None
        try:
            # pre_ping: replicas outlive database restarts and fail-overs; a dead pooled connection is replaced
            # instead of failing the request that draws it.
            # JSON columns through msgspec: every usage row carries its key's parts, and the standard library's
            # encoder was a tenth of a record's ingestion.
            self.engine: Engine = create_engine(with_driver(url), pool_pre_ping=not url.startswith("sqlite"),
                                                json_serializer=_json_text, json_deserializer=msgspec.json.decode)
        except InvalidInputError:
            raise
        except Exception as exc:  # SQLAlchemy raises several types for a bad URL or a missing driver
            hint = (f": PostgreSQL's driver here is psycopg, {_PSYCOPG}://user:password@host/db"
                    if url.startswith("postgres") else "")
            raise InvalidInputError(f"catalog database URL {shown!r} is not usable: {exc}{hint}") from None
        self.dialect = self.engine.dialect.name
        if self.dialect not in ("sqlite", "postgresql"):
            # Upserts and the replicas' locks are written for these two (and tested on both).
            raise InvalidInputError(f"catalog database URL {shown!r}: use SQLite (sqlite:///path) or PostgreSQL "
                                    "(postgresql+psycopg://user:password@host/db)")
        if self.dialect == "sqlite":
            _sqlite_events(self.engine)
        self.locks = ClusterLocks(self.engine.url)
        if migrate:
            from jaxcache.service.catalog.migrate import upgrade

            try:
                upgrade(self)
            except OperationalError as exc:  # the server is not there, or refuses this user
                raise CatalogUnreachableError(unreachable(self.engine.url, exc)) from None
        # session(): a session that commits on success and rolls back on error.
        self.session = sessionmaker(self.engine, expire_on_commit=False).begin
        # reader(): a plain connection for read-only Core queries: no ORM session machinery on hot read paths.
        self.reader = self.engine.connect
        self.write_engine = self._write_engine(self.engine)
        self._write_sessions = sessionmaker(self.write_engine.execution_options(jaxcache_write=True),
                                            expire_on_commit=False)
        # statements(): a connection for single statements, on PostgreSQL each its own transaction (AUTOCOMMIT,
        # without BEGIN and ROLLBACK round trips around each): for the reads made on every request (change counts)
        # and for a write one statement says whole (PostgreSQL's inbox store).
        self.statements = (self.engine.execution_options(isolation_level="AUTOCOMMIT")
                           if self.dialect == "postgresql" else self.engine).connect
        # Writers that read then write (report ingestion, a rescan's commit) take turns in this process before
        # they take the database's own lock (see writing()), so they never wait on each other inside the database.
        self.write_lock = threading.RLock()
        self._on_loop: sqlite3.Connection | None = None  # loop_reader()'s, opened at its first use

    @staticmethod
    def _write_engine(engine: Engine) -> Engine:
        """The engine of writing()'s transactions. On an SQLite file, an engine of its own whose one pooled
        connection keeps a large page cache from one write to the next (this process's writers take turns); the
        readers' pool keeps SQLite's small default. Elsewhere ``engine``."""
        if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
            return engine
        # No limit on overflow: a second connection (never kept, its cache closed with it) rather than a wait.
        writes = create_engine(engine.url, pool_size=1, max_overflow=-1, json_serializer=_json_text,
                               json_deserializer=msgspec.json.decode)
        _sqlite_events(writes, cache=_WRITE_CACHE)
        return writes

    @contextmanager
    def writing(self, cache: str) -> Iterator[Session]:
        """A session whose transaction is the only one writing ``cache``'s reports and index rows, in every replica:
        what it reads stays what it updates (no lost updates to per-key aggregates when two replicas ingest
        reports on the same keys at once). PostgreSQL: a transaction-level advisory lock per cache, released at
        commit or rollback (or with the connection); SQLite: ``BEGIN IMMEDIATE``, which takes the database's
        write lock before the first read."""
        with self.write_lock, self._write_sessions.begin() as s:
            if self.dialect == "postgresql":
                s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(f"write:{cache}")})
            yield s

    def loop_reader(self) -> sqlite3.Connection | None:
        """On an SQLite file, the event loop's own driver connection: in autocommit (each statement sees every
        commit before it), and with no busy timeout, so a statement that would wait for a lock raises
        ``sqlite3.OperationalError`` at once instead of stalling the loop. In WAL mode a reader waits for no writer,
        so that is rare. None elsewhere: PostgreSQL's reads can wait for a lock, and a memory database is the
        pool's own."""
        path = self.engine.url.database
        if self.dialect != "sqlite" or path in (None, "", ":memory:"):
            return None
        if self._on_loop is None:
            # mode=rw: a catalog file gone meanwhile is an error (which the pool's read then names), not a new one.
            uri = f"{pathlib.Path(path).absolute().as_uri()}?mode=rw"
            self._on_loop = sqlite3.connect(uri, uri=True, timeout=0, isolation_level=None, check_same_thread=False)
        return self._on_loop

    def insert(self, table):
        """The dialect's INSERT for ``table``: :func:`dialect_insert`."""
        return dialect_insert(self.dialect, table)

    def dispose(self) -> None:
        if self._on_loop is not None:
            self._on_loop.close()
            self._on_loop = None
        for engine in {id(e): e for e in (self.engine, self.write_engine)}.values():
            engine.dispose()
        self.locks.dispose()


def dialect_insert(dialect: str, table):
    """The dialect's INSERT for ``table`` (a model or a Table), which has ``on_conflict_do_update`` and
    ``on_conflict_do_nothing``: an upsert that two replicas may run at once."""
    return (postgresql if dialect == "postgresql" else sqlite).insert(table)


def bulk_insert(conn: Connection, table: Table, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Insert ``rows`` (tuples of ``columns``' values, none JSON) into ``table`` in ``conn``'s transaction, the
    fastest way each database takes many rows: a binary ``COPY`` on PostgreSQL (the server parses no text, the client
    formats none), the driver's own executemany on SQLite (SQLAlchemy's processed every value in Python first)."""
    if not rows:
        return
    names = ", ".join(conn.dialect.identifier_preparer.quote(c) for c in columns)
    if conn.dialect.name == "postgresql":
        with conn.connection.driver_connection.cursor() as cursor:  # type: ignore[union-attr]  # psycopg's
            with cursor.copy(f"COPY {table.name} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types([_binary_type(table.c[c].type) for c in columns])
                for row in rows:
                    copy.write_row(row)
        return
    conn.exec_driver_sql(f"INSERT INTO {table.name} ({names}) VALUES ({', '.join('?' * len(columns))})",
                         list(rows))


def _binary_type(column: TypeEngine[object]) -> str:
    """The PostgreSQL type a binary COPY sends a column's values as."""
    for kind, name in ((String, "text"), (BigInteger, "int8"), (SmallInteger, "int2"), (Integer, "int4"),
                       (Float, "float8"), (Boolean, "bool")):
        if isinstance(column, kind):
            return name
    raise TypeError(f"bulk_insert: no binary COPY type for {column!r}")


def analyze(conn: Connection, tables: Sequence[str]) -> None:
    """Gather the planner's statistics of ``tables`` (after a bulk load), for every connection of the catalog.

    SQLite loads statistics into a connection only when it reads the schema, and ANALYZE loads them into its own:
    every other connection, in every process, kept planning with what it had read before (none, or a small table's),
    and kept its cached statements' plans. The statistics table made anew is a change of schema, which each one sees
    at its next statement. It holds only the run tables' statistics: SQLite plans the listings by their indexes
    without any, so only PostgreSQL's catalog analyzes ``entries``."""
    if conn.dialect.name == "sqlite":
        conn.execute(text("DROP TABLE IF EXISTS sqlite_stat1"))
    for table in tables:
        conn.execute(text(f"ANALYZE {table}"))


def _json_text(value: object) -> str:
    return msgspec.json.encode(value).decode()


def _sqlite_events(engine: Engine, *, cache: str | None = None) -> None:
    """The catalog's ways with an SQLite engine: WAL, its own BEGINs; ``cache``: a page cache pragma its
    connections start with."""
    event.listen(engine, "connect", functools.partial(_sqlite_connect, cache=cache))
    event.listen(engine, "begin", _sqlite_begin)


def _sqlite_connect(dbapi_conn, _record, *, cache: str | None) -> None:
    # SQLAlchemy emits BEGIN itself (_sqlite_begin), so that reads are inside the transaction too and a writer can
    # ask for BEGIN IMMEDIATE; the driver's own transaction handling would begin only at the first write.
    dbapi_conn.isolation_level = None
    # WAL lets the API read while a rescan writes; NORMAL sync is safe with WAL and much faster.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    # Writers of other processes (replicas on one file) queue on the write lock; a rescan's commit can be long.
    cur.execute("PRAGMA busy_timeout=60000")
    if cache is not None:
        cur.execute(cache)
    cur.close()


#: The page cache of a connection that writes (SQLite's default is 2 MiB): a pass of the drain writes many megabytes
#: of rows and index pages, and with the default it spilled and read pages again mid-way. Kept from one write to the
#: next by the write engine's one pooled connection (the pool's readers keep the default): given back at each
#: checkin, every pass read the pages it touched again (bench/README.md, "The drain's warm page cache").
_WRITE_CACHE = "PRAGMA cache_size=-65536"


def _sqlite_begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("jaxcache_write") else "BEGIN")


# --- Change counts (entries, usage) per cache, behind cached statistics and ETags in every replica. A count only
# grows, to max(next, time in µs), so a rebuilt catalog never hands back a client's stale ``ETag`` as current.

ENTRIES, USAGE = "entries", "usage"


@dataclass(frozen=True, slots=True)
class Generation:
    """A cache's change counts at one moment: equal twice means nothing changed in between."""

    entries: int = 0
    usage: int = 0

    def tag(self) -> str:
        return f"{self.entries:x}.{self.usage:x}"


@dataclass(slots=True)
class _Read:
    """One read of a cache's change counts, and the requests waiting for it (Generations.current)."""

    done: anyio.Event = field(default_factory=anyio.Event)
    value: Generation | None = None
    error: Exception | None = None


@functools.cache
def _counts() -> Select:
    # Built once: every listing reads it, and building it cost as much as running it.
    return select(ChangeCountRow.entries, ChangeCountRow.usage).where(ChangeCountRow.cache == bindparam("cache"))


@functools.cache
def _counts_sql() -> str:
    # The same statement as the driver's text, for the event loop's read, where SQLAlchemy's own work per
    # execution was 40 times SQLite's.
    return str(_counts().compile(dialect=sqlite.dialect()))


class Generations:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        # current()'s reads on the event loop's side, by cache: the one being read, and the one that waits for it.
        self._reading: dict[str, _Read] = {}
        self._next: dict[str, _Read] = {}

    async def current(self, cache: str) -> Generation:
        """:meth:`get` as a request that arrives now must see it, without a thread of its own. On SQLite, read on
        the event loop by a connection that never waits (Catalog.loop_reader): a few microseconds, where a hop to a
        thread cost revalidations (answered ``304``) a third of their time. Elsewhere, or where SQLite would make it
        wait, one read in a thread serves every request that arrived before it began: a wait on the event loop, not
        a thread and a query each. A read already under way may have begun before this request: this one then
        waits for the next read, which begins once that one ends."""
        if (now := self._without_waiting(cache)) is not None:
            return now
        read = self._next.get(cache)
        if read is None:
            read = self._next[cache] = _Read()
            # Shielded: the requests that joined this read wait for it, even when the one that began it goes away.
            with anyio.CancelScope(shield=True):
                await self._read(cache, read)
        else:
            await read.done.wait()
        if read.value is None:
            assert read.error is not None
            raise read.error  # what get() raised, in each request that waited for this read
        return read.value

    async def _read(self, cache: str, read: _Read) -> None:
        if (ahead := self._reading.get(cache)) is not None:
            await ahead.done.wait()
        del self._next[cache]  # requests arriving from now on wait for the read after this one
        self._reading[cache] = read
        try:
            read.value = await anyio.to_thread.run_sync(self.get, cache)
        except Exception as exc:  # noqa: BLE001 - raised in every request that waited for it
            read.error = exc
        finally:
            del self._reading[cache]
            read.done.set()

    def _without_waiting(self, cache: str) -> Generation | None:
        """The counts read on the event loop, or None where that could wait (see current())."""
        try:
            if (conn := self.catalog.loop_reader()) is None:
                return None
            # fetchall: the statement runs to its end, which ends its read transaction (a snapshot kept open would
            # hide later commits and hold back the WAL's checkpoints).
            rows = conn.execute(_counts_sql(), (cache,)).fetchall()
        except sqlite3.Error:  # locked (a checkpoint, a recovery, an exclusive writer), or worse: the read in a
            return None  # thread waits, or fails as every other read does
        return Generation(*rows[0]) if rows else Generation()

    def get(self, cache: str, conn: Connection | None = None) -> Generation:
        """The counts now; ``conn``: read in that connection's transaction, as a page's first statement (on SQLite
        the page then comes from the same snapshot as its tag, and one checkout of the pool serves both)."""
        if conn is None:
            with self.catalog.statements() as own:
                return self.get(cache, own)
        row = conn.execute(_counts(), {"cache": cache}).first()
        return Generation() if row is None else Generation(row.entries, row.usage)

    def bump(self, cache: str, *what: str) -> None:
        """Count a change of ``what`` in ``cache``; call after the change's commit, so a new count implies it."""
        now = int(time.time() * 1e6)
        table = ChangeCountRow.__table__
        moved = {w: case((table.c[w] + 1 > now, table.c[w] + 1), else_=literal(now)) for w in what}
        first = {w: now if w in what else 0 for w in (ENTRIES, USAGE)}
        with self.catalog.session() as s:  # one statement, a write: no read before it
            s.execute(self.catalog.insert(ChangeCountRow).values(cache=cache, **first)
                      .on_conflict_do_update(index_elements=["cache"], set_=moved))
