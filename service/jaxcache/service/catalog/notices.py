"""PostgreSQL's LISTEN/NOTIFY on the report inbox: accepting a record notifies ``jaxcache_inbox`` (its cache as the
payload, in the accepting statement), and the drain of every loops process listens, so that it folds a record as
soon as any process or replica stored it instead of polling the inbox."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import func
from sqlalchemy.engine import URL

CHANNEL = "jaxcache_inbox"
#: libpq's keepalives on the listening connection: a server that vanished is noticed within about a minute, not the
#: kernel's two hours, and the drain reconnects.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def notify(cache: Any) -> Any:
    """The SQL expression that notifies the drains that a record of ``cache`` waits (sent at commit)."""
    return func.pg_notify(CHANNEL, cache)


class InboxListener:
    """A connection of its own (psycopg's, autocommit, never pooled) that LISTENs on :data:`CHANNEL`; used by one
    thread."""

    def __init__(self, url: URL) -> None:
        self._conninfo = make_conninfo(url.set(drivername="postgresql").render_as_string(hide_password=False),
                                       **_KEEPALIVES)
        self._conn: psycopg.Connection[Any] | None = None

    def wait(self, timeout_s: float) -> bool:
        """Whether the drain should look at the inbox: a record was stored (every notice received so far is taken),
        or the connection was (re)made, when a record may have come unnoticed; False after ``timeout_s`` without
        one. Raises :class:`psycopg.Error` when the connection is lost (the next call connects again)."""
        if self._conn is None:
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
            try:
                self._conn.execute(f"LISTEN {CHANNEL}")
            except psycopg.Error:
                self.close()
                raise
            return True
        try:
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
            conn.close()  # psycopg's close never raises for a connection already gone
