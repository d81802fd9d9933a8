"""Each background pass is claimed by its loop's lock in the catalog (``loop:drain``, ``loop:rescan``,
``loop:verify``): while another process holds one, this process skips that loop's passes, and its status stays as
that process last published it; requests (a rescan on demand) are not loop passes. On both catalogs, through a
real app and the catalog's own locks, as another replica would hold them."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from conftest import settled
from jaxcache.errors import UnreachableError
from jaxcache.service.app import create_app
from jaxcache.service.background import Loops
from jaxcache.service.catalog.coordination import ClusterLocks, LoopStatuses
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.metrics import Metrics
from reports_support import hit, keys_of, run
from test_service import H_ADMIN, H_READ, REPORT, make_settings

PATIENCE_S = 60.0
H_REPORT = {"Authorization": f"Bearer {REPORT}", "content-type": "application/json"}


def _until(condition, what: str):
    deadline = time.monotonic() + PATIENCE_S
    while not (found := condition()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)
    return found


def _cache(client: TestClient) -> dict:
    return client.get("/v1/caches", headers=H_READ).json()["caches"][0]


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path) -> str:
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else \
        f"sqlite:///{tmp_path / 'catalog.sqlite'}"


def test_a_loop_whose_lock_another_process_holds_skips_its_passes(tmp_path, cache_copy, jax_caches, db):
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    app = create_app(make_settings(tmp_path, {"demo": str(cache_copy)}, db=db, rescan_s=0.2))
    other = ClusterLocks(make_url(db))  # another replica's
    try:
        with TestClient(app) as client:
            settled(client)
            drain, rescan = other.get("loop:drain"), other.get("loop:rescan")
            assert drain.acquire(timeout=PATIENCE_S) and rescan.acquire(timeout=PATIENCE_S)
            try:
                before = client.get("/readyz").json()["loops"]
                scanned = _cache(client)["last_scan_s"]
                posted = client.post("/v1/reports?cache=demo", headers=H_REPORT,
                                     content=run("j", "r1", [hit(train, 3, time.time())]).to_json())
                assert posted.status_code == 202, posted.text
                # Rounds come and go (a rescan folds what waits too, so both are held), and the record waits.
                rounds = app.state.jaxcache.loops.rescan_rounds
                _until(lambda: app.state.jaxcache.loops.rescan_rounds >= rounds + 3, "three more rescan rounds")
                assert _cache(client)["reports_waiting"] == 1 and _cache(client)["last_scan_s"] == scanned
                after = client.get("/readyz").json()["loops"]
                assert [after[loop]["last_success_s"] for loop in ("drain", "rescan")] == \
                    [before[loop]["last_success_s"] for loop in ("drain", "rescan")]
                # A rescan asked for is not the loop's pass: it runs (and folds what waits).
                assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
                assert _cache(client)["last_scan_s"] > scanned and _cache(client)["reports_waiting"] == 0
                posted = client.post("/v1/reports?cache=demo", headers=H_REPORT,
                                     content=run("j", "r2", [hit(train, 3, time.time())]).to_json())
                assert posted.status_code == 202, posted.text
            finally:
                drain.release()
            # The pass notes its success after its fold has committed: wait for both.
            _until(lambda: _cache(client)["reports_waiting"] == 0 and client.get("/readyz").json()["loops"]["drain"][
                "last_success_s"] > before["drain"]["last_success_s"],
                "the record folded, and the drain's pass noted, once the drain's lock was free")
            rescan.release()
    finally:
        other.dispose()


def test_a_pass_starting_in_another_process_keeps_the_last_success_and_error_shown(tmp_path, db):
    """Each process publishes its own view of a loop: one whose first pass starts after another's success (or
    whose pass succeeds after another's error) must not hide it from any /readyz."""
    catalog = Catalog(db)
    statuses, elsewhere = LoopStatuses(catalog.engine), LoopStatuses(catalog.engine)  # another process's reads
    try:
        statuses.publish("rescan", {"last_success_s": 100.0, "last_error": "root gone", "last_error_s": 90.0,
                                    "failures": 0})
        statuses.publish("rescan", {"last_success_s": None, "running_since_s": 110.0, "failures": 0})
        shown = elsewhere.read()["rescan"]
        assert shown["running_since_s"] == 110.0 and shown["last_success_s"] == 100.0
        assert (shown["last_error"], shown["last_error_s"]) == ("root gone", 90.0)
        statuses.publish("rescan", {"last_success_s": 120.0, "last_error": "other", "last_error_s": 80.0,
                                    "running_since_s": None})
        shown = elsewhere.read()["rescan"]
        assert shown["last_success_s"] == 120.0 and shown["running_since_s"] is None
        assert (shown["last_error"], shown["last_error_s"]) == ("root gone", 90.0)
    finally:
        catalog.dispose()


def test_a_pass_starting_in_another_process_keeps_its_loop_shown_failing(tmp_path, db):
    """#71: with two workers, each one's rescan pass published the loop as that worker last saw it (no failure of its
    own: "ok") while every round failed on a root that did not answer. A pass shows the last round's outcome, any
    process's, until it ends; the failed rounds in a row count across processes."""
    settings = make_settings(tmp_path, {"demo": str(tmp_path)}, db=db)
    catalogs = [Catalog(db), Catalog(db)]  # two processes': each its own engine and locks
    mine, other = (Loops(Metrics(["demo"]), catalog, settings) for catalog in catalogs)
    running, finish = threading.Event(), threading.Event()

    def unreachable() -> list[tuple[str, Exception]]:
        return [("demo", UnreachableError("s3://bucket/cache at http://10.0.0.9:9000 did not answer within 20 s"))]

    def hanging() -> list[tuple[str, Exception]]:
        running.set()
        finish.wait(PATIENCE_S)
        return unreachable()

    try:
        mine.one_round("rescan", 300, unreachable, failures=lambda failed: failed)
        passing = threading.Thread(target=other.one_round, args=("rescan", 300, hanging),
                                   kwargs={"failures": lambda failed: failed})
        passing.start()
        assert running.wait(PATIENCE_S)
        for loops in (mine, other):  # what any process's /readyz shows while the other's pass runs
            shown = loops.shared()["rescan"]
            assert (shown.health(time.time()), shown.failed_caches, shown.failures) == ("failing", ("demo",), 1)
            assert shown.running_since_s is not None and "did not answer" in (shown.last_error or "")
        finish.set()
        passing.join(PATIENCE_S)
        assert mine.shared()["rescan"].failures == 2  # rounds failed in a row, whichever process ran them
        mine.one_round("rescan", 300, list, failures=lambda failed: failed)
        shown = other.shared()["rescan"]
        assert (shown.health(time.time()), shown.failures, shown.failed_caches) == ("ok", 0, ())
    finally:
        finish.set()
        for catalog in catalogs:
            catalog.dispose()


def test_on_sqlite_a_status_is_published_while_another_process_holds_the_catalogs_write_lock(tmp_path):
    """A pass blocked on the catalog's write lock still shows running (and stuck) in every process."""
    db = tmp_path / "catalog.sqlite"
    catalog = Catalog(f"sqlite:///{db}")
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        LoopStatuses(catalog.engine).publish("rescan", {"running_since_s": 110.0})
        assert LoopStatuses(catalog.engine).read() == {"rescan": {"running_since_s": 110.0}}
    finally:
        holder.close()
        catalog.dispose()


#: Writes of how a round ended (its status no longer running) wait while ``stalled`` has a row, as they would on
#: a lock another replica holds or a database that stalls: PostgreSQL's own trigger holds them here.
STALL_ROUND_ENDS = """
CREATE TABLE stalled (since timestamptz);
INSERT INTO stalled VALUES (now());
CREATE FUNCTION stall_round_end() RETURNS trigger AS $$
BEGIN
  WHILE NEW.status->>'running_since_s' IS NULL AND EXISTS (SELECT 1 FROM stalled) LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER stall_round_end BEFORE INSERT OR UPDATE ON loop_health
  FOR EACH ROW EXECUTE FUNCTION stall_round_end();
"""


def test_a_loop_waiting_on_the_catalog_never_stalls_requests(tmp_path, cache_copy, pg_url):
    """Loops note each round's outcome in the catalog (``loop_health``), which may wait on a lock or a slow
    database. That wait belongs to the pass's thread: the event loop keeps answering."""
    app = create_app(make_settings(tmp_path, {"demo": str(cache_copy)}, db=pg_url, rescan_s=0.2))
    engine = create_engine(pg_url)
    try:
        with TestClient(app) as client:
            settled(client)
            with engine.begin() as conn:
                conn.execute(text(STALL_ROUND_ENDS))
            time.sleep(1.0)  # rescan and drain rounds end (every 0.2 s and 1 s) and write how they ended
            answered: list[int] = []
            asking = threading.Thread(target=lambda: answered.append(client.get("/healthz").status_code),
                                      daemon=True)
            asking.start()
            asking.join(10.0)
            with engine.begin() as conn:
                conn.execute(text("DELETE FROM stalled"))
            assert answered == [200], "GET /healthz waited for a loop's write to the catalog"
    finally:
        engine.dispose()
