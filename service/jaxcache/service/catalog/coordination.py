"""How the processes and replicas sharing one catalog coordinate: cluster locks (docs/service.md, "Replicas and
locks"), PostgreSQL's NOTIFY/LISTEN on the report inbox, and each background loop's shared status."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

import filelock
import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.service.catalog.models import LoopHealthRow

log = logging.getLogger("jaxcache.service")

#: Server-side keepalives on lock connections: a vanished holder loses its lock in a minute, not two hours.
_KEEPALIVES = {"tcp_keepalives_idle": 30, "tcp_keepalives_interval": 10, "tcp_keepalives_count": 3}
#: libpq's keepalives on the listening connection: the drain notices a vanished server and reconnects.
_LISTEN_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
CHANNEL = "jaxcache_inbox"


class LockBusyError(JaxcacheError):
    """Another replica of the service (or another request in this one) holds the lock."""


def advisory_key(name: str) -> int:
    """The signed 64-bit PostgreSQL advisory lock key of a lock name (stable across processes and versions)."""
    return int.from_bytes(hashlib.sha256(f"jaxcache:{name}".encode()).digest()[:8], "big", signed=True)


def _sqlite_file(url: URL) -> str | None:
    """The absolute path of an SQLite catalog's file; None for PostgreSQL or an in-memory SQLite catalog."""
    database = url.database
    if url.get_backend_name() != "sqlite" or database in (None, "", ":memory:") or url.query.get("mode") == "memory":
        return None
    return os.path.abspath(database)


def state_dir(database: str) -> str:
    """The folder beside an SQLite catalog's file that holds its lock and status files: ``<catalog file>.d``. (SQLite
    keeps its own ``-wal`` and ``-shm`` files beside the catalog: they stay there.)"""
    return f"{database}.d"


def _made(folder: str) -> str:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"cannot make the catalog's folder of locks and statuses {folder}: "
                                f"{exc.strerror or exc}") from None
    return folder


class _FileLocks:
    """``<name>.lock`` files in the SQLite catalog's :func:`state_dir`.

    Versions before it kept them beside the catalog file (``catalog.sqlite.<name>.lock``). Where such a file is
    there, a version before this one may be running on the same catalog (a rolling restart, a rollback), so that lock
    is taken too, after this one's: an older process never waits on the folder's, so the two never wait on each
    other. They stay until removed by hand (docs/operator-guide.md): a lock file deleted while an older process may
    open it again would no longer keep it out."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.folder = _made(state_dir(database))

    def acquire(self, name: str, timeout_s: float | None) -> object | None:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "-", name)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        held: list[filelock.FileLock] = []
        for path in (os.path.join(self.folder, f"{safe}.lock"), f"{self.database}.{safe}.lock"):
            if held and not os.path.exists(path):
                break
            lock = filelock.FileLock(path)
            try:
                lock.acquire(timeout=-1 if deadline is None else max(deadline - time.monotonic(), 0),
                             poll_interval=0.1)
            except filelock.Timeout:
                self.release(held)
                return None
            held.append(lock)
        return held

    def release(self, handle: object) -> None:
        for lock in reversed(cast(list[filelock.FileLock], handle)):
            lock.release()


class _AdvisoryLocks:
    """Session-level advisory locks, each on an unpooled connection of its own (a pooled one would hand its lock to
    whoever borrows it next). Waiters queue on the server (lock_timeout bounds them) and get the lock in turn."""

    def __init__(self, url: URL) -> None:
        self.engine: Engine = create_engine(url, poolclass=NullPool)

    def acquire(self, name: str, timeout_s: float | None) -> object | None:
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        key, got = advisory_key(name), False
        try:
            for setting, value in _KEEPALIVES.items():
                conn.execute(text(f"SET {setting} = {int(value)}"))
            if (conn.dialect.server_version_info or (0,)) >= (14,):
                # A replica killed while it waits: the server does not read a waiting backend's socket otherwise.
                conn.execute(text("SET client_connection_check_interval = 5000"))
            if timeout_s is not None and timeout_s <= 0:
                got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
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
        finally:
            if not got:
                conn.close()
        return (conn, name) if got else None

    def release(self, handle: object) -> None:
        conn, name = cast(tuple[Connection, str], handle)
        try:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": advisory_key(name)})
        except Exception as exc:  # the connection is gone: so is the lock
            said = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]  # the server's words, not the SQL
            log.warning("releasing lock %s: %s (the server released it with the connection)", name, said)
        finally:
            conn.close()


#: Each backend's ``acquire`` gives a handle, or None when not free within ``timeout_s`` (None: no limit); no
#: backend: an in-memory catalog, which no other process can reach.
_Backend = _FileLocks | _AdvisoryLocks | None


class ClusterLock:
    """One named lock shared by every replica on a catalog, used like :class:`threading.Lock`."""

    def __init__(self, name: str, backend: _Backend) -> None:
        self.name = name
        self._backend = backend
        self._local = threading.Lock()
        self._handle: object | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        deadline = None if not blocking or timeout < 0 else time.monotonic() + timeout
        if not self._local.acquire(blocking, -1 if deadline is None else timeout):
            return False
        handle = None
        try:
            remaining = 0.0 if not blocking else None if deadline is None else max(deadline - time.monotonic(), 0)
            handle = self._handle = self.name if self._backend is None else self._backend.acquire(self.name, remaining)
        finally:  # not free, or the database is unreachable: this process holds nothing
            if handle is None:
                self._local.release()
        return handle is not None

    def release(self) -> None:
        handle, self._handle = self._handle, None
        try:
            if handle is not None and self._backend is not None:
                self._backend.release(handle)
        finally:
            self._local.release()

    def __enter__(self) -> ClusterLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class ClusterLocks:
    """The named locks of one catalog database: one :class:`ClusterLock` object per name in this process."""

    def __init__(self, url: URL) -> None:
        database = _sqlite_file(url)
        self._backend: _Backend = (_AdvisoryLocks(url) if url.get_backend_name() == "postgresql" else
                                   None if database is None else _FileLocks(database))
        self._locks: dict[str, ClusterLock] = {}
        self._guard = threading.Lock()

    def get(self, name: str) -> ClusterLock:
        """The lock called ``name`` (e.g. ``prune:prod``)."""
        with self._guard:
            if name not in self._locks:
                self._locks[name] = ClusterLock(name, self._backend)
            return self._locks[name]

    def dispose(self) -> None:
        if isinstance(self._backend, _AdvisoryLocks):
            self._backend.engine.dispose()


class PruneLocks:
    """The prune lock of each cache, shared by every replica on the catalog."""

    def __init__(self, locks: ClusterLocks) -> None:
        self._locks = locks

    def get(self, cache: str) -> ClusterLock:
        return self._locks.get(f"prune:{cache}")


def notify(cache: Any) -> Any:
    """The SQL expression that notifies the drains that a record of ``cache`` waits (sent at commit)."""
    return func.pg_notify(CHANNEL, cache)


class InboxListener:
    """An autocommit psycopg connection of its own that LISTENs on :data:`CHANNEL`; used by one thread."""

    def __init__(self, url: URL) -> None:
        self._conninfo = make_conninfo(url.set(drivername="postgresql").render_as_string(hide_password=False),
                                       **_LISTEN_KEEPALIVES)
        self._conn: psycopg.Connection[Any] | None = None

    def wait(self, timeout_s: float) -> bool:
        """Whether the drain should look at the inbox: a notice came (all received are taken), or the connection was
        (re)made and one may have been missed. Raises :class:`psycopg.Error` on a lost connection."""
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self._conninfo, autocommit=True)
                self._conn.execute(f"LISTEN {CHANNEL}")
                return True
            if not any(True for _ in self._conn.notifies(timeout=timeout_s, stop_after=1)):
                return False
            for _ in self._conn.notifies(timeout=0):  # those that came meanwhile: one pass folds their records too
                pass
        except psycopg.Error:
            self.close()
            raise
        return True

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class LoopStatuses:
    """Each background loop's status (a JSON object) as the process running its passes last published it, read by
    every process: ``loop_health`` on PostgreSQL, ``loop-<loop>.json`` files in an SQLite catalog's
    :func:`state_dir`; none for an in-memory catalog, which no other process reads. A version before this one
    published them beside the catalog file (``catalog.sqlite.loop-<loop>.json``): while one of those is there, the
    newer of the two is the loop's status (during a rolling restart the older version may be running the loop)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine if engine.dialect.name == "postgresql" else None
        self._database = _sqlite_file(engine.url)

    def publish(self, loop: str, status: Mapping[str, Any]) -> None:
        """Replace the loop's status, keeping the latest last success and last error any process published: one
        whose first pass starts after another's success must not hide it."""
        if self._engine is not None:
            with self._engine.begin() as conn:
                row = conn.execute(select(LoopHealthRow.status).where(LoopHealthRow.loop == loop)
                                   .with_for_update()).first()
                merged, now = _with_history(dict(status), row.status if row is not None else {}), time.time()
                conn.execute(pg_insert(LoopHealthRow).values(loop=loop, status=merged, updated_s=now)
                             .on_conflict_do_update(index_elements=["loop"], set_={"status": merged, "updated_s": now}))
        elif self._database is not None:
            # Not under the catalog's write lock (a blocked pass may wait for it); a flock keeps merges apart.
            path = os.path.join(_made(state_dir(self._database)), f"loop-{loop}.json")
            with filelock.FileLock(f"{path}.lock"):
                merged = _with_history(dict(status), _read_json(path))
                with open(f"{path}.tmp", "w") as out:
                    json.dump(merged, out)
                os.replace(f"{path}.tmp", path)

    def read(self) -> dict[str, dict[str, Any]]:
        """Every loop's last published status, by loop."""
        if self._engine is not None:
            with self._engine.connect() as conn:
                return dict(conn.execute(select(LoopHealthRow.loop, LoopHealthRow.status)).all())
        if self._database is not None:
            found: dict[str, tuple[float, dict[str, Any]]] = {}
            for prefix in (f"{self._database}.loop-", os.path.join(state_dir(self._database), "loop-")):
                for path in glob.glob(f"{glob.escape(prefix)}*.json"):
                    loop, at = path[len(prefix):-len(".json")], _mtime(path)
                    if loop not in found or at >= found[loop][0]:
                        found[loop] = (at, _read_json(path))
            return {loop: status for loop, (_, status) in found.items() if status}
        return {}


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):  # not published yet, or cut short by a crash
        return {}
    return found if isinstance(found, dict) else {}


def _with_history(status: dict[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    if (before.get("last_success_s") or 0) > (status.get("last_success_s") or 0):
        status["last_success_s"] = before["last_success_s"]
    if (before.get("last_error_s") or 0) > (status.get("last_error_s") or 0):
        status["last_error_s"], status["last_error"] = before["last_error_s"], before.get("last_error")
    return status
