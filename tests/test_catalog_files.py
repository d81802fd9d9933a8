"""The catalog database's URL as a user writes it, and the files an SQLite catalog keeps: its locks and each loop's
status in one folder beside it (``catalog.sqlite.d/``), not a dozen files around it, with a version before this one
(which kept them beside the file) still kept out of each lock during a rolling restart."""

from __future__ import annotations

import json
import os
import time

import filelock
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from conftest import settled
from jaxcache.errors import InvalidInputError
from jaxcache.service.app import create_app
from jaxcache.service.catalog.coordination import ClusterLocks, LoopStatuses
from jaxcache.service.catalog.database import Catalog
from test_service import H_ADMIN, make_settings


@pytest.mark.parametrize(("url", "said"), [
    ("postgres://jax:secret@db.example:5432/jax", "write postgresql+psycopg://jax:***@db.example:5432/jax"),
    ("postgres+psycopg2://jax:secret@db.example/jax", "write postgresql+psycopg://jax:***@db.example/jax"),
    ("postgresql+psycopg2://jax:secret@db.example/jax", "postgresql+psycopg://user:password@host/db"),
])
def test_a_postgresql_url_without_the_driver_here_names_the_one_to_write(url, said):
    """SQLAlchemy's own words were "Can't load plugin: sqlalchemy.dialects:postgres" (#73)."""
    with pytest.raises(InvalidInputError) as refused:
        Catalog(url, migrate=False)
    assert said in str(refused.value) and "secret" not in str(refused.value), refused.value
    assert "\n" not in str(refused.value)


def test_a_postgresql_url_without_a_driver_takes_psycopg():
    """SQLAlchemy's default driver is psycopg2 before 2.1, which jaxcache-service does not install."""
    catalog = Catalog("postgresql://jax:secret@127.0.0.1:9/jax", migrate=False)
    try:
        assert catalog.engine.url.drivername == "postgresql+psycopg"
    finally:
        catalog.dispose()


def test_an_sqlite_catalog_keeps_its_locks_and_statuses_in_one_folder(tmp_path, cache_copy):
    app = create_app(make_settings(tmp_path, {"demo": str(cache_copy)}))
    with TestClient(app) as client:
        settled(client)
        assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
        loops = client.get("/readyz").json()["loops"]
        assert loops["rescan"]["last_success_s"], loops
    beside = {p.name for p in tmp_path.iterdir()} - {cache_copy.name}
    assert beside <= {"catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite-shm", "catalog.sqlite.d"}, beside
    inside = {p.name for p in (tmp_path / "catalog.sqlite.d").iterdir()}
    assert {"migrate.lock", "scan-demo.lock", "loop-rescan.json"} <= inside, inside


def test_a_lock_an_older_version_holds_beside_the_catalog_keeps_this_one_out(tmp_path):
    """During a rolling restart a version before this one may run on the same file, taking its locks beside it."""
    database = tmp_path / "catalog.sqlite"
    locks = ClusterLocks(make_url(f"sqlite:///{database}"))
    older = filelock.FileLock(f"{database}.scan-demo.lock")  # as that version takes `scan:demo`
    with older:
        assert not locks.get("scan:demo").acquire(blocking=False)
        assert locks.get("scan:other").acquire(blocking=False), "a lock it never took is this folder's alone"
        locks.get("scan:other").release()
    with locks.get("scan:demo"), pytest.raises(filelock.Timeout):  # and the older version waits for this one
        filelock.FileLock(f"{database}.scan-demo.lock").acquire(blocking=False)
    assert not os.path.exists(f"{database}.scan-other.lock")


def test_the_newer_status_of_a_loop_is_read_wherever_it_was_published(tmp_path):
    database = tmp_path / "catalog.sqlite"
    catalog = Catalog(f"sqlite:///{database}")
    try:
        statuses = LoopStatuses(catalog.engine)
        statuses.publish("rescan", {"last_success_s": 100.0})
        statuses.publish("verify", {"last_success_s": 100.0})
        older = f"{database}.loop-rescan.json"  # what an older version running the loop publishes meanwhile
        with open(older, "w") as out:
            json.dump({"last_success_s": 200.0}, out)
        later = time.time() + 5
        os.utime(older, (later, later))
        with open(f"{database}.loop-verify.json", "w") as out:
            json.dump({"last_success_s": 50.0}, out)
        os.utime(f"{database}.loop-verify.json", (1, 1))
        read = statuses.read()
        assert read["rescan"]["last_success_s"] == 200.0 and read["verify"]["last_success_s"] == 100.0, read
    finally:
        catalog.dispose()
