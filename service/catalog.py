"""The catalog: an index of every cache root's entries, rebuilt from storage by a rescan, plus what only the
catalog holds (pins, the prune audit log). SQLite by default; any SQLAlchemy URL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from jaxcache.errors import InvalidInputError
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    String,
    create_engine,
    event,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker


class Base(DeclarativeBase):
    pass


class CacheRow(Base):
    """A configured cache root and its last scan."""

    __tablename__ = "caches"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    url: Mapped[str] = mapped_column(String(1024))
    last_scan_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_scan_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_scan_error: Mapped[str | None] = mapped_column(String(2048), nullable=True)


class EntryRow(Base):
    """One ``-cache`` file (kind ``entry``) or one orphaned ``-atime`` file (kind ``orphan``)."""

    __tablename__ = "entries"
    cache: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(512), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    module: Mapped[str] = mapped_column(String(448))
    name: Mapped[str] = mapped_column(String(512))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_s: Mapped[float] = mapped_column(Float)
    # Derived (newest of -atime and creation) but stored: it is what lists sort and prunes select on.
    last_used_s: Mapped[float] = mapped_column(Float)
    generation: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    has_atime: Mapped[bool] = mapped_column(Boolean, default=False)
    atime_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    compression: Mapped[str | None] = mapped_column(String(16), nullable=True)
    compile_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    reason: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    first_seen_s: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("ix_entries_size", "cache", "kind", "size_bytes", "key"),
        Index("ix_entries_last_used", "cache", "kind", "last_used_s", "key"),
        Index("ix_entries_created", "cache", "kind", "created_s", "key"),
        Index("ix_entries_compile", "cache", "kind", "compile_seconds", "key"),
        Index("ix_entries_module", "cache", "kind", "module"),
    )


class PinRow(Base):
    """A keep rule: an exact key or a glob over keys and function names that prunes never delete."""

    __tablename__ = "pins"
    cache: Mapped[str] = mapped_column(String(64), primary_key=True)
    pattern: Mapped[str] = mapped_column(String(512), primary_key=True)
    created_s: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(128))


class PruneRow(Base):
    """One applied prune, for the audit log."""

    __tablename__ = "prunes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cache: Mapped[str] = mapped_column(String(64), index=True)
    at_s: Mapped[float] = mapped_column(Float)
    who: Mapped[str] = mapped_column(String(128))
    policy: Mapped[dict] = mapped_column(JSON)
    deleted: Mapped[int] = mapped_column(Integer)
    bytes_freed: Mapped[int] = mapped_column(BigInteger)
    already_gone: Mapped[int] = mapped_column(Integer)
    changed: Mapped[int] = mapped_column(Integer)
    errors: Mapped[list] = mapped_column(JSON)


class Catalog:
    """Owns the engine and hands out sessions."""

    def __init__(self, url: str) -> None:
        self.url = url
        if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
            directory = os.path.dirname(url[len("sqlite:///") :])
            if directory:
                os.makedirs(directory, exist_ok=True)
        try:
            self.engine: Engine = create_engine(url, future=True)
        except Exception as exc:  # SQLAlchemy raises several types for a bad URL or a missing driver
            raise InvalidInputError(f"catalog database URL {url!r} is not usable: {exc}") from exc
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on error."""
        with self._sessions.begin() as s:
            yield s

    @contextmanager
    def reader(self) -> Iterator[Connection]:
        """A plain connection for read-only Core queries: no ORM session machinery on hot read paths."""
        with self.engine.connect() as conn:
            yield conn

    def dispose(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL lets the API read while a rescan writes; NORMAL sync is safe with WAL and much faster.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()
