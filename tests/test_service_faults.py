"""Faults inside one service process: background loops that fail and recover, a root that vanishes and comes back,
single-entry deletes that are audited and take JAX's lock."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import filelock
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from conftest import fake_entries, settled
from jaxcache.service.app import create_app
from jaxcache.service.rounds import close_interrupted_prunes
from test_service import BOTH, H_ADMIN, H_READ, make_settings


def _wait(predicate, what: str, patience_s: float = 60.0):
    """A bound on waiting for background work, not a timing assertion."""
    deadline = time.monotonic() + patience_s
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)
    return found


def test_a_loop_that_fails_is_retried_logged_once_and_shown(tmp_path, cache_copy, postgres, caplog):
    """The verify pass's table is renamed away for three rounds (a real ProgrammingError, as a schema changed under
    the service would raise: neither our error type nor the database being away, so its traceback is logged), then
    put back: the loop backs off (1, 2 and 4 s), shows its failure, logs it once and recovers."""
    db = postgres.create_database()
    app = create_app(make_settings(tmp_path, {"demo": str(cache_copy)}, db=db, rescan_s=60))
    catalog = db.rsplit("/", 1)[1]
    postgres.psql("ALTER TABLE verifications RENAME TO verifications_away", catalog)
    with caplog.at_level(logging.INFO, logger="jaxcache.service"), TestClient(app) as client:
        settled(client)
        failing = _wait(lambda: (r := client.get("/readyz").json()["loops"].get("verify")) and r["failures"] and r,
                        "the verify loop to report its failure")
        assert 'demo: catalog database: relation "verifications" does not exist' in failing["last_error"], failing
        assert failing["state"] == "failing" and failing["caches"] == {"demo": "failing"}
        third = _wait(lambda: (r := client.get("/readyz").json()["loops"]["verify"])["failures"] >= 3 and r,
                      "three failed verify rounds")
        postgres.psql("ALTER TABLE verifications_away RENAME TO verifications", catalog)
        assert third["failures"] == 3, "the fourth round came before the 4 s backoff"
        recovered = _wait(lambda: (r := client.get("/readyz").json()["loops"]["verify"])["last_success_s"] and r,
                          "the verify loop to recover")
        assert recovered["failures"] == 0 and recovered["last_error_s"] < recovered["last_success_s"]
        assert recovered["last_success_s"] - third["last_error_s"] >= 4, "retried without backing off (1, 2, 4 s)"
        assert recovered["state"] == "ok" and recovered["caches"] == {"demo": "ok"}
        assert client.get("/readyz").status_code == 200  # a failing loop does not take the replica out
        metrics = client.get("/metrics").text
    assert 'jaxcache_loop_errors_total{kind="ProgrammingError",loop="verify"} 3.0' in metrics
    assert 'jaxcache_loop_failing{loop="verify"} 0.0' in metrics
    assert 'jaxcache_loop_last_success_timestamp_seconds{loop="rescan"}' in metrics
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "background verify failed" in errors[0].getMessage(), [r.getMessage() for r in errors]
    assert errors[0].exc_info is not None  # not our error type: the traceback helps whoever reads the log
    assert any("recovered after 3 failed round(s)" in r.getMessage() for r in caplog.records)


@BOTH
def test_a_root_that_vanishes_keeps_its_rows_and_refuses_prunes(svc, cache_copy):
    listed = svc.get("/v1/caches/demo/entries?limit=1000", headers=H_READ).json()["entries"]
    files = sorted(p.name for p in cache_copy.iterdir())
    away = cache_copy.with_name("unmounted")
    for gone in ("moved", "a file"):
        cache_copy.rename(away)
        if gone == "a file":
            cache_copy.write_text("not a directory")
        r = svc.post("/v1/caches/demo/rescan", headers=H_ADMIN)
        assert r.status_code == 502 and str(cache_copy) in r.json()["detail"], r.text
        assert svc.get("/v1/caches/demo/entries?limit=1000", headers=H_READ).json()["entries"] == listed
        ready = svc.get("/readyz")
        assert ready.status_code == 503 and "unmounted volume" in ready.json()["detail"]["demo"]
        (info,) = svc.get("/v1/caches", headers=H_READ).json()["caches"]
        assert "does not exist" in info["last_scan_error"] or "not a directory" in info["last_scan_error"]
        assert "unmounted volume" in svc.get("/caches/demo", headers=H_READ).text  # the dashboard says so
        for dry_run in (True, False):
            r = svc.post("/v1/caches/demo/prune", headers=H_ADMIN, json={"unused_for": "1d", "dry_run": dry_run})
            assert r.status_code == 502 and "nothing is pruned" in r.json()["detail"], r.text
        r = svc.delete(f"/v1/caches/demo/entries/{listed[0]['key']}", headers=H_ADMIN)
        assert r.status_code == 502, r.text
        if gone == "a file":
            cache_copy.unlink()
        away.rename(cache_copy)
        assert sorted(p.name for p in cache_copy.iterdir()) == files  # nothing was deleted meanwhile
    metrics = svc.get("/metrics").text
    failed = [line for line in metrics.splitlines() if line.startswith('jaxcache_scan_errors_total{cache="demo"')]
    assert failed and sum(float(line.split()[-1]) for line in failed) >= 2, failed  # moved, then a file
    assert svc.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
    assert svc.get("/readyz").status_code == 200
    assert svc.get("/v1/caches", headers=H_READ).json()["caches"][0]["last_scan_error"] is None
    assert svc.get("/v1/caches/demo/entries?limit=1000", headers=H_READ).json()["entries"] == listed
    audit = svc.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"]
    assert audit == [], "refused prunes delete nothing and leave no audit row"


@BOTH
def test_deleting_one_entry_waits_for_jax_lock_and_is_audited(svc, cache_copy):
    key = svc.get("/v1/caches/demo/entries?limit=1", headers=H_READ).json()["entries"][0]["key"]
    lock = filelock.FileLock(str(cache_copy / ".lockfile"))
    done = threading.Event()
    with lock:  # a JAX process in the middle of its LRU bookkeeping
        worker = threading.Thread(target=lambda: (svc.delete(f"/v1/caches/demo/entries/{key}", headers=H_ADMIN),
                                                  done.set()))
        worker.start()
        time.sleep(0.3)
        assert not done.is_set() and (cache_copy / f"{key}-cache").exists(), "deleted under JAX's lock"
    worker.join(30)
    assert done.is_set() and not (cache_copy / f"{key}-cache").exists() and not (cache_copy / f"{key}-atime").exists()
    (row,) = svc.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"]
    assert (row["kind"], row["state"], row["planned"], row["deleted"], row["who"]) == (
        "delete", "done", 1, 1, row["who"])
    assert row["policy"] == {"key": key} and row["ended_s"] >= row["at_s"]
    assert svc.delete(f"/v1/caches/demo/entries/{key}", headers=H_ADMIN).status_code == 404
    assert len(svc.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"]) == 1


@BOTH
def test_an_applied_prune_is_audited_before_it_deletes(svc, cache_copy):
    """The audit row and its planned objects are committed before the first delete, and a prune stopped part-way
    (here: the root moved away, as an unmount would, while it deletes) says how far it got.

    JAX's lock, which the prune takes before its first delete, is held until the audit reads running; then the root
    goes away once the tenth entry in the plan is gone, with about a thousand still to go."""
    from sqlalchemy import select

    from jaxcache.service.catalog.models import PruneItemRow

    state = svc.app.state.jaxcache
    fake = fake_entries(cache_copy, 1000, age_days=20)  # least recently used: deleted first
    assert svc.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
    policy = {"unused_for": "1d", "list_limit": 10}
    order = [d["key"] for d in svc.post("/v1/caches/demo/prune", headers=H_ADMIN, json=policy).json()["delete"]]
    assert set(order) <= fake and len(order) == 10
    tenth, away = cache_copy / f"{order[-1]}-cache", cache_copy.with_name("unmounted")
    before = {p.name for p in cache_copy.iterdir()}
    answer: dict[str, object] = {}
    asking = threading.Thread(target=lambda: answer.update(r=svc.post(
        "/v1/caches/demo/prune", headers=H_ADMIN, json={**policy, "dry_run": False})))
    with filelock.FileLock(str(cache_copy / ".lockfile")):  # a JAX process in its LRU bookkeeping
        asking.start()
        row = _wait(lambda: (p := svc.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"]) and p[0],
                    "the prune's audit row")
        assert row["state"] == "running" and row["planned"] > len(fake), row
        with state.catalog.session() as s:
            planned = set(s.scalars(select(PruneItemRow.key)))
        assert len(planned) == row["planned"] and fake <= planned
        assert {p.name for p in cache_copy.iterdir()} == before, "deleted before the intent was committed"
    while asking.is_alive() and tenth.exists():
        pass  # no sleep: the prune has a thousand entries to go, and this reacts within microseconds
    cache_copy.rename(away)
    asking.join(60)
    r = answer["r"]
    assert r.status_code == 502 and "does not exist" in r.json()["detail"], r.text
    (row,) = svc.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"]
    left = {p.name for p in away.iterdir()}
    deleted = {key for key in planned if f"{key}-cache" not in left}
    assert 10 <= len(deleted) < row["planned"], "the prune was not stopped part-way"
    assert row["state"] == "failed" and row["deleted"] == len(deleted) and row["ended_s"] is not None, row
    assert row["errors"][0].startswith(f"stopped after {len(deleted)} of {row['planned']} objects"), row["errors"]
    assert "does not exist" in row["errors"][0]
    gone = before - left
    assert {n.rsplit("-", 1)[0] for n in gone} == deleted and len(gone) >= 2 * len(deleted) - 1  # -cache first
    away.rename(cache_copy)


@contextlib.contextmanager
def _change_counts_held(catalog) -> Iterator[None]:
    """Another connection holds the PostgreSQL catalog's change counts table locked against writes (what
    :meth:`State.changed` bumps) until the block ends. Reads go on."""
    engine = create_engine(catalog.engine.url)
    try:
        with engine.begin() as pg:
            pg.execute(text("LOCK TABLE change_counts IN EXCLUSIVE MODE"))
            yield
    finally:
        engine.dispose()


@pytest.mark.parametrize("svc", ["postgresql"], indirect=True)
def test_a_prune_asked_once_an_interrupted_one_reads_closed_is_accepted(svc, cache_copy):
    """A replica that restarts closes the prune its predecessor left running; whoever sees it closed may prune at
    once (the cache's prune lock is not held past the close). Here the refresh that follows the close waits for
    the change counts, which another connection holds, while the user acts on what the audit says. PostgreSQL only:
    on SQLite the change counts' write lock is the catalog's, which the prune itself needs."""
    from jaxcache.service.prune import audit as prune_audit

    state = svc.app.state.jaxcache
    prune_audit.begin(state.catalog, "demo", [], who="the replica that died", policy_json={"unused_for": "7d"})
    answers: dict[str, object] = {}
    with _change_counts_held(state.catalog):
        closing = threading.Thread(target=close_interrupted_prunes, args=(state, "demo"))
        closing.start()
        _wait(lambda: svc.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"][0]["state"] == "interrupted",
              "the interrupted prune to read closed")
        asking = threading.Thread(target=lambda: answers.update(prune=svc.post(
            "/v1/caches/demo/prune", headers=H_ADMIN, json={"unused_for": "7d", "dry_run": False})))
        asking.start()
        # Accepted, the prune deletes every entry (all unused for 10 days), then it too waits for the change counts;
        # refused (409), it answers at once.
        _wait(lambda: not asking.is_alive() or not any(cache_copy.glob("*-cache")), "the prune to run or be refused")
        assert closing.is_alive(), "the close's refresh did not wait for the change counts: nothing was shown"
    closing.join(60)
    asking.join(60)
    assert not closing.is_alive() and not asking.is_alive()
    assert answers["prune"].status_code == 200, answers["prune"].text
    assert not any(cache_copy.glob("*-cache"))


class _HoldingHandler(logging.Handler):
    """Holds the thread that logs a prune's close until ``go`` is set, as a slow log sink would."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.held, self.go = threading.Event(), threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "was interrupted" in record.getMessage():
            self.held.set()
            self.go.wait(60)


@BOTH
def test_the_prune_lock_is_free_whenever_the_audit_reads_an_interrupted_prune_closed(svc, cache_copy):
    """However long the close's own log line takes, the audit does not read the prune closed while this replica
    still holds the cache's prune lock: a prune asked as soon as it reads closed is accepted."""
    from jaxcache.service.prune import audit as prune_audit

    state = svc.app.state.jaxcache
    prune_audit.begin(state.catalog, "demo", [], who="the replica that died", policy_json={"unused_for": "7d"})
    handler = _HoldingHandler()
    logging.getLogger("jaxcache.service").addHandler(handler)
    try:
        closing = threading.Thread(target=close_interrupted_prunes, args=(state, "demo"))
        closing.start()
        _wait(handler.held.is_set, "the close to log")
        assert svc.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"][0]["state"] == "interrupted"
        r = svc.post("/v1/caches/demo/prune", headers=H_ADMIN, json={"unused_for": "7d", "dry_run": False})
    finally:
        handler.go.set()
        logging.getLogger("jaxcache.service").removeHandler(handler)
    closing.join(60)
    assert r.status_code == 200, r.text
    assert not any(cache_copy.glob("*-cache"))
