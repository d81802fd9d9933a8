"""What tests/test_service_serving.py and tests/test_service_storms.py share: a table of the catalog held locked by
another connection until the test releases it, and the service's client. Nothing here measures a time: PATIENCE_S
only bounds a wait."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from conftest import settled
from jaxcache.service.app import create_app
from reports_support import settings

#: Bound on waiting for a held request; the assertions never depend on it.
PATIENCE_S = 60


class HeldTable:
    """A lock on a table of a PostgreSQL catalog, taken by a connection of the test's own and held until
    :meth:`release`: the service's statements that need a conflicting lock wait for it in the database."""

    def __init__(self, url: str, table: str, mode: str = "ACCESS EXCLUSIVE") -> None:
        self.table = table
        self.released = threading.Event()
        self._engine = create_engine(url)
        self._conn = self._engine.connect()
        self._tx = self._conn.begin()
        self._conn.execute(text(f"LOCK TABLE {table} IN {mode} MODE"))
        self._mutex = threading.Lock()

    def waiting(self) -> int:
        """How many sessions wait for a lock on the table now."""
        with self._engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM pg_locks WHERE relation = CAST(:t AS regclass) "
                                         "AND NOT granted"), {"t": self.table}).scalar_one())

    def release(self) -> None:
        """Let go of the lock (again: nothing); from any thread."""
        with self._mutex:
            if self.released.is_set():
                return
            self._tx.rollback()
            self._conn.close()
            self._engine.dispose()
            self.released.set()


@pytest.fixture
def client(tmp_path, cache_copy) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}))) as c:
        settled(c)
        yield c


def wait_for(condition: Callable[[], bool]) -> None:
    """Bound on waiting for the service's threads; not a timing assertion."""
    import time

    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, "the service never got there"
        time.sleep(0.01)
