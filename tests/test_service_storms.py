"""Report storms through the service: POSTed records are accepted into the inbox (202) and folded by the drain, each
once; a full inbox answers 503 with Retry-After and the refused record reaches the catalog from its file at the
next rescan; a client that gives up mid-upload is not a server error (docs/service.md, "Run records").

Nothing here measures a time: where a test needs the drain held, it holds the cache's write lock as another
replica's drain would, and lets go when it is done."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import msgspec
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text

from conftest import serve_env, settled, start_serve, stop_serve, wait_ready
from jaxcache.service.app import create_app
from jaxcache.service.catalog.coordination import advisory_key
from reports_support import (
    H_READ,
    H_REPORT,
    READ,
    REPORT,
    compiled,
    counted,
    folded,
    hit,
    keys_of,
    put_record,
    rescan,
    run,
    settings,
    write,
)
from serving_support import PATIENCE_S


def _job(train: str, processes: int) -> list:
    at = time.time() - 120
    return [run("storm", "r1", [write(train, 3.0, at) if p == 0 else compiled(train, 3.0, at),
                                hit(f"jit_other-{p:064x}", 1, at)], at=at + 60, process_index=p,
                process_count=processes) for p in range(processes)]


def _post(client, record):
    return client.post("/v1/reports?cache=demo", content=record.to_json(),
                       headers={**H_REPORT, "content-type": "application/json"})


@pytest.fixture
def client(tmp_path, cache_copy):
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}))) as c:
        settled(c)
        yield c


def test_records_posted_together_are_each_accepted_and_folded_once(client, jax_caches):
    recs = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 6)
    # Large records stored by many request threads at once (each compresses its body): none is damaged.
    filler = [hit(f"jit_filler_{i % 7}-{i:064x}", 1, time.time() - 100) for i in range(400)]
    recs = [msgspec.structs.replace(r, keys=[*r.keys, *filler]) for r in recs]
    with ThreadPoolExecutor(6) as ex:
        answers = list(ex.map(lambda r: _post(client, r), recs))
    for p, r in enumerate(answers):
        assert r.status_code == 202, r.text
        assert (r.json()["run_id"], r.json()["process_index"], r.json()["keys"]) == ("r1", p, 402)
    folded(client)
    job = client.get("/v1/caches/demo/jobs/storm", headers=H_READ).json()
    assert job["processes"] == 6 and job["misses"] == 6
    assert all(m["cause"] is not None for m in job["missed"])  # explained in the drain, not later
    assert counted(client, 'jaxcache_misses_total{cache="demo"', 6) == 6  # each process's miss once
    assert counted(client, 'jaxcache_reports_ingested_total{cache="demo",source="report"}', 6) == 6
    # Sent again (a client retrying): accepted, folded, and nothing counted twice.
    assert _post(client, recs[3]).status_code == 202
    folded(client)
    assert client.get("/v1/caches/demo/jobs/storm", headers=H_READ).json()["processes"] == 6


def test_many_clients_sending_running_totals_at_once_are_folded_to_their_last_totals(client, jax_caches):
    """20 clients (a run's processes) each send their running record 5 times, all at once, then an older version
    again: every client's last totals are what the catalog holds (the red team's 1,000 reports from 20 clients,
    smaller)."""
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    at = time.time() - 600

    def version(p: int, v: int):
        return run("crowd", "r1", [hit(train, v, at + v)], at=at + v, process_index=p, process_count=20)

    def client_sends(p: int) -> list[int]:
        return [_post(client, version(p, v)).status_code for v in range(1, 6)]

    with ThreadPoolExecutor(20) as ex:
        assert [set(s) for s in ex.map(client_sends, range(20))] == [{202}] * 20
    with ThreadPoolExecutor(20) as ex:
        stale = list(ex.map(lambda p: _post(client, version(p, 2)), range(20)))
    assert {(r.status_code, r.json()["stale"]) for r in stale} == {(202, True)}
    folded(client)
    job = client.get("/v1/caches/demo/jobs/crowd", headers=H_READ).json()
    assert job["processes"] == 20 and job["hits"] == 100, job
    hits = {e["key"]: e["hits"] for e in client.get("/v1/caches/demo/entries?limit=100", headers=H_READ).json()[
        "entries"]}
    assert hits[train] == 100


def test_a_runs_processes_share_its_misses_explanation(client):
    """A job's processes that compile the same key share one usage row of their run and its explanation: the row
    counts each of them (``missed``), and jaxcache_misses_total counts each process once."""
    from jaxcache.service.catalog.models import UsageRow

    state = client.app.state.jaxcache
    ghost = "jit_ghost-" + "d" * 64  # no entry of its function: its miss is new_program whenever the test runs
    for rec in _job(ghost, 5):
        r = _post(client, rec)
        assert r.status_code == 202, r.text
    folded(client)
    with state.catalog.reader() as conn:
        (row,) = conn.execute(select(UsageRow.processes, UsageRow.missed, UsageRow.counted, UsageRow.cause,
                                     UsageRow.compiles).where(UsageRow.cache == "demo", UsageRow.run_id == "r1",
                                                              UsageRow.key == ghost)).all()
    assert tuple(row) == (5, 5, 5, "new_program", 5)
    assert counted(client, 'jaxcache_misses_total{cache="demo",cause="new_program"}', 5) == 5


def test_a_full_inbox_answers_503_with_retry_after_and_the_record_file_is_folded_by_rescan(
        tmp_path, cache_copy, pg_url, jax_caches):
    recs = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 3)
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, db=pg_url, report_inbox=2))) as c:
        settled(c)
        # Another replica's drain of this cache holds its write lock: what is accepted waits in the inbox.
        engine = create_engine(pg_url)
        with engine.connect() as held:
            held.execute(text("SELECT pg_advisory_lock(:k)"), {"k": advisory_key("write:demo")})
            assert [_post(c, r).status_code for r in recs[:2]] == [202, 202]
            # The job writes its record file as well (the client always does), and posts: the inbox is full.
            put_record(cache_copy, recs[2])
            refused = _post(c, recs[2])
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["retry-after"]) >= 1
            assert "JAXCACHE_REPORT_INBOX=2" in refused.json()["detail"]
            assert {x["name"]: x["reports_waiting"] for x in c.get("/v1/caches", headers=H_READ).json()["caches"]
                    } == {"demo": 2}
            held.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": advisory_key("write:demo")})
        engine.dispose()
        folded(c)
        assert c.get("/v1/caches/demo/jobs/storm", headers=H_READ).json()["processes"] == 2
        assert rescan(c)["records_ingested"] == 1  # the refused record, from its file
        job = c.get("/v1/caches/demo/jobs/storm", headers=H_READ).json()
        assert job["processes"] == 3 and job["misses"] == 3


@pytest.mark.slow
def test_a_client_that_gives_up_mid_upload_is_not_a_server_error(tmp_path, cache_copy, jax_caches):
    """A body shorter than its Content-Length (the job's timeout, a restart): one line at INFO at most, no
    traceback, not counted as a refused report (the alert on refusals would fire); the next record goes in."""
    log = tmp_path / "serve.log"
    env = serve_env({READ: "read", REPORT: "report"})
    proc, base = start_serve({"demo": cache_copy}, f"sqlite:///{tmp_path / 'c.sqlite'}", env=env,
                             stdout=log.open("w"))
    try:
        wait_ready(proc, base, output=log.read_text, patience_s=PATIENCE_S)
        host, port = base.removeprefix("http://").split(":")
        body = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 1)[0].to_json()
        for _ in range(5):
            with socket.create_connection((host, int(port)), timeout=PATIENCE_S) as s:
                s.sendall(b"POST /v1/reports?cache=demo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          + f"Authorization: Bearer {REPORT}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                          + body[: len(body) // 2])
        import httpx

        r = httpx.post(f"{base}/v1/reports?cache=demo", content=body, timeout=PATIENCE_S,
                       headers={**H_REPORT, "content-type": "application/json"})
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + PATIENCE_S
        while httpx.get(f"{base}/v1/caches/demo/jobs/storm", headers=H_READ).status_code != 200:
            assert time.monotonic() < deadline, "the record after the aborted uploads was never folded"
            time.sleep(0.1)
        metrics = httpx.get(f"{base}/metrics").text
        refused = [line for line in metrics.splitlines()
                   if line.startswith("jaxcache_reports_rejected_total{") and not line.endswith(" 0.0")]
        assert not refused, metrics  # its series exist from the start, at 0
    finally:
        stop_serve(proc)
    said = log.read_text()
    assert "Traceback" not in said and "ERROR" not in said, said
    assert said.count("upload ended before its body did") <= 5



def test_records_of_a_cache_no_replica_serves_are_drained_and_never_fill_the_inbox(tmp_path, cache_copy, jax_caches):
    """A record accepted for a cache since dropped from the settings (or served by another replica only) is folded
    by whichever drain runs: rows nobody drains would fill the inbox and refuse every job's report."""
    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import RunRow
    from jaxcache.service.reports.ingest import queue

    db = f"sqlite:///{tmp_path / 'catalog.sqlite'}"
    rec = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 1)[0]
    catalog = Catalog(db)
    queue.accept(catalog, "dropped", rec, rec.to_json())
    catalog.dispose()
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, db=db, report_inbox=1))) as c:
        settled(c)
        state = c.app.state.jaxcache
        deadline = time.monotonic() + PATIENCE_S
        while queue.waiting(state.catalog):
            assert time.monotonic() < deadline, "the dropped cache's record was never drained"
            time.sleep(0.02)
        with state.catalog.reader() as conn:
            assert conn.execute(select(RunRow.run_id).where(RunRow.cache == "dropped")).scalars().all() == ["r1"]
        assert _post(c, rec).status_code == 202  # the inbox has room


@pytest.mark.parametrize("source", ["report", "storage"])
def test_an_inbox_row_that_does_not_decode_is_dropped_and_the_others_are_folded(tmp_path, cache_copy, jax_caches,
                                                                                 source):
    """A row no version of the service can read (a damaged value, another version's format) never wedges the
    drain: it is dropped with a warning and counted once under where it came from, whichever drain takes it (the
    loop's, or the first rescan's own), and the records beside it are folded."""
    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import InboxRow
    from jaxcache.service.reports.ingest import queue

    db = f"sqlite:///{tmp_path / 'catalog.sqlite'}"
    recs = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 2)
    catalog = Catalog(db)
    queue.accept(catalog, "demo", recs[0], recs[0].to_json())
    name = ".jaxcache/runs/2026-12-04/r1-p1.json" if source == "storage" else None
    with catalog.session() as s:
        s.add(InboxRow(cache="demo", run_id="r1", process_index=1, updated_s=time.time(), source=source,
                       record=name, body=b"not zstd at all", received_s=time.time()))
    catalog.dispose()
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, db=db))) as c:
        settled(c)
        folded(c)
        assert c.get("/v1/caches/demo/jobs/storm", headers=H_READ).json()["processes"] == 1
        series = f'jaxcache_reports_malformed_total{{source="{source}"}}'
        assert counted(c, series, 1) == 1.0
        assert counted(c, "jaxcache_reports_malformed_total", 1) == 1.0, "counted under one source, once"


def test_a_row_dropped_in_a_pass_the_catalog_refused_is_counted_once(pg_url, jax_caches):
    """A pass the catalog refuses is folded again a record at a time: a row the first try had already dropped (it
    does not decode) is dropped and counted once, beside the record refused, and the good record is folded."""
    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import InboxRow, RunRow
    from jaxcache.service.reports.ingest import queue

    good, _, refused = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 3)
    refused = msgspec.structs.replace(refused, host="h" * 2000)  # over the column (accepted by another version)
    catalog = Catalog(pg_url)
    try:
        for record in (good, refused):
            queue.accept(catalog, "demo", record, record.to_json())
        with catalog.session() as s:
            s.add(InboxRow(cache="demo", run_id="r1", process_index=1, updated_s=time.time(), source="report",
                           record=None, body=b"not zstd at all", received_s=time.time()))
        drained = queue.drain(catalog, "demo")
        with catalog.reader() as conn:
            folded = conn.execute(select(RunRow.process_index)).scalars().all()
    finally:
        catalog.dispose()
    assert drained.malformed == {"report": 2}, drained.malformed
    assert folded == [0]


@pytest.mark.parametrize("where", ["the same catalog", "a second catalog, as another process has"])
def test_a_record_accepted_while_a_drain_holds_the_sqlite_catalogs_write_lock_is_stored_once_it_commits(
        tmp_path, jax_caches, where):
    """A record accepted (in this process, or another on the same file) while a drain pass holds the SQLite
    catalog's write lock is not stored under it, nor lost or refused: it is stored once the pass commits."""
    import threading

    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.reports.ingest import queue

    db = f"sqlite:///{tmp_path / 'catalog.sqlite'}"
    catalog = Catalog(db)
    accepting = catalog if where == "the same catalog" else Catalog(db)
    rec = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 1)[0]
    holding, release = threading.Event(), threading.Event()

    def drain_pass() -> None:
        with catalog.writing("demo") as s:
            s.connection()  # BEGIN IMMEDIATE: the file's write lock, as a pass's first statement takes it
            holding.set()
            release.wait(PATIENCE_S)

    holder = threading.Thread(target=drain_pass)
    holder.start()
    accepted: list[queue.Accepted] = []
    storing = threading.Thread(target=lambda: accepted.append(queue.accept(accepting, "demo", rec, rec.to_json())))
    try:
        assert holding.wait(PATIENCE_S)
        storing.start()
        assert queue.waiting(catalog) == 0, "stored under the drain's write lock"
    finally:
        release.set()
        holder.join()
    storing.join(PATIENCE_S)  # a bound on waiting for another thread, not a timing assertion
    try:
        assert accepted and not accepted[0].stale and queue.waiting(catalog) == 1
    finally:
        for each in {id(c): c for c in (catalog, accepting)}.values():
            each.dispose()
