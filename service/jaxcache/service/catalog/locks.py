"""Locks that every replica of the service sharing one catalog respects: one rescanner and one pruner of a cache
at a time. They live where the catalog lives (PostgreSQL advisory locks on connections of their own, ``flock``
files beside an SQLite file, a thread lock for an in-memory catalog), and a replica that dies releases them. Why
they are shaped so, and what survives when they overlap: docs/service.md, "Replicas and locks"."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from typing import Protocol, cast

import filelock
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from jaxcache.errors import JaxcacheError

log = logging.getLogger("jaxcache.service")

#: Server-side TCP keepalives on PostgreSQL lock connections: a holder whose machine vanished is dropped (and its
#: lock released) after about idle + interval x count seconds, instead of the kernel's default two hours.
_KEEPALIVES = {"tcp_keepalives_idle": 30, "tcp_keepalives_interval": 10, "tcp_keepalives_count": 3}


class LockBusyError(JaxcacheError):
    """Another replica of the service (or another request in this one) holds the lock."""


def advisory_key(name: str) -> int:
    """The signed 64-bit PostgreSQL advisory lock key of a lock name (stable across processes and versions)."""
    return int.from_bytes(hashlib.sha256(f"jaxcache:{name}".encode()).digest()[:8], "big", signed=True)


class _Backend(Protocol):
    def acquire(self, name: str, timeout_s: float | None) -> object | None:
        """A handle of the held lock, or None when it was not free within ``timeout_s`` (None: no limit)."""

    def release(self, handle: object) -> None: ...


class _ThreadOnly:
    """An in-memory catalog: no other process can reach it."""

    def acquire(self, name: str, timeout_s: float | None) -> object | None:
        return name

    def release(self, handle: object) -> None:
        pass


class _FileLocks:
    """``<database file>.<name>.lock`` files beside an SQLite catalog."""

    def __init__(self, database: str) -> None:
        self.database = database

    def path(self, name: str) -> str:
        return f"{self.database}.{re.sub(r'[^A-Za-z0-9_.-]', '-', name)}.lock"

    def acquire(self, name: str, timeout_s: float | None) -> object | None:
        lock = filelock.FileLock(self.path(name))
        try:
            lock.acquire(timeout=-1 if timeout_s is None else timeout_s, poll_interval=0.1)
        except filelock.Timeout:
            return None
        return lock

    def release(self, handle: object) -> None:
        handle.release()  # type: ignore[attr-defined]


class _AdvisoryLocks:
    """Session-level advisory locks, each on a connection of its own (never a pooled one: returning a connection
    to a pool would keep its lock held by whoever borrows it next). A wait queues on the server (lock_timeout
    bounds it), so waiting replicas get the lock in turn."""

    def __init__(self, url: URL) -> None:
        self.engine: Engine = create_engine(url, poolclass=NullPool)

    def acquire(self, name: str, timeout_s: float | None) -> object | None:
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        key = advisory_key(name)
        try:
            for setting, value in _KEEPALIVES.items():
                conn.execute(text(f"SET {setting} = {int(value)}"))
            version = conn.dialect.server_version_info  # set once connected
            if version is not None and version >= (14,):
                # A replica killed while it waits for a lock: the server would otherwise notice only once the wait
                # ends (it does not read the socket of a backend that runs a query).
                conn.execute(text("SET client_connection_check_interval = 5000"))
            if timeout_s is not None and timeout_s <= 0:
                got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
            else:
                # lock_timeout 0 means no limit; a bounded wait ends with SQLSTATE 55P03 (lock_not_available).
                ms = 0 if timeout_s is None else max(1, int(timeout_s * 1000))
                conn.execute(text(f"SET lock_timeout = {ms}"))
                try:
                    conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
                    got = True
                except OperationalError as exc:
                    if getattr(exc.orig, "sqlstate", None) != "55P03":
                        raise
                    got = False
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            return None
        return (conn, name)

    def release(self, handle: object) -> None:
        conn, name = cast(tuple[Connection, str], handle)  # what acquire() returned
        try:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": advisory_key(name)})
        except Exception as exc:  # the connection is gone: so is the lock
            said = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]  # the server's words, not the SQL
            log.warning("releasing lock %s: %s (the server released it with the connection)", name, said)
        finally:
            conn.close()


class ClusterLock:
    """One named lock shared by every replica on a catalog. Like :class:`threading.Lock`: ``acquire(blocking,
    timeout)`` returns whether it was taken, ``release()``; as a context manager it waits without limit."""

    def __init__(self, name: str, backend: _Backend) -> None:
        self.name = name
        self._backend = backend
        self._local = threading.Lock()
        self._handle: object | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock; wait for it when ``blocking`` (at most ``timeout`` seconds unless negative)."""
        deadline = None if not blocking or timeout < 0 else time.monotonic() + timeout
        if not self._local.acquire(blocking, -1 if deadline is None else timeout):
            return False
        try:
            remaining = 0.0 if not blocking else None if deadline is None else max(deadline - time.monotonic(), 0)
            handle = self._backend.acquire(self.name, remaining)
        except BaseException:  # the backend failed (database unreachable): this process holds nothing
            self._local.release()
            raise
        if handle is None:
            self._local.release()
            return False
        self._handle = handle
        return True

    def release(self) -> None:
        """Release the lock (to other threads and other replicas)."""
        handle, self._handle = self._handle, None
        try:
            if handle is not None:
                self._backend.release(handle)
        finally:
            self._local.release()

    def locked(self) -> bool:
        """Whether this process holds it."""
        return self._handle is not None

    def __enter__(self) -> ClusterLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class ClusterLocks:
    """The named locks of one catalog database: one :class:`ClusterLock` object per name in this process."""

    def __init__(self, url: URL) -> None:
        self.url = url
        backend = url.get_backend_name()
        if backend == "postgresql":
            self._backend: _Backend = _AdvisoryLocks(url)
            self.kind = "advisory"
        elif backend == "sqlite" and url.database and url.database != ":memory:" and url.query.get("mode") != "memory":
            self._backend = _FileLocks(os.path.abspath(url.database))
            self.kind = "file"
        else:  # an in-memory SQLite catalog (the catalog accepts no other database)
            self._backend = _ThreadOnly()
            self.kind = "thread"
        self._locks: dict[str, ClusterLock] = {}
        self._guard = threading.Lock()

    def get(self, name: str) -> ClusterLock:
        """The lock called ``name`` (e.g. ``prune:prod``)."""
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = ClusterLock(name, self._backend)
            return lock

    def dispose(self) -> None:
        engine = getattr(self._backend, "engine", None)
        if engine is not None:
            engine.dispose()


class PruneLocks:
    """The prune lock of each cache, shared by every replica on the catalog."""

    def __init__(self, locks: ClusterLocks) -> None:
        self._locks = locks

    def get(self, cache: str) -> ClusterLock:
        return self._locks.get(f"prune:{cache}")
