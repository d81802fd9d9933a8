"""Report storms through the app: one writer per process takes what is queued in batches, answers each record with
its own result, answers 503 with Retry-After when its queue is full, and leaves a storm's explanations and entry
copies for a quiet moment while a lone record's are made before its answer (docs/service.md, "Report storms").

Nothing here measures a time: a batch is held until the test releases it, and the assertions are about what was
done before what."""

from __future__ import annotations

import re
import threading
from typing import Any

from fastapi.testclient import TestClient

from conftest import settled
from jaxcache.service.app import create_app
from reports_support import H_READ, H_REPORT, compiled, hit, keys_of, run, settings
from serving_support import PATIENCE_S, HeldOnce, post_held_then_together, post_in_thread, wait_for


def _job(train: str, processes: int) -> list:
    import time

    from reports_support import compiled, write

    at = time.time() - 120
    return [run("storm", "r1", [write(train, 3.0, at) if p == 0 else compiled(train, 3.0, at),
                                hit(f"jit_other-{p:064x}", 1, at)], at=at + 60, process_index=p,
                process_count=processes) for p in range(processes)]


def test_reports_posted_together_are_ingested_in_one_batch_each_answered_with_its_own(client, monkeypatch,
                                                                                     jax_caches):
    from jaxcache.service.ingestion import reports as ingestion

    state = client.app.state.jaxcache
    held = HeldOnce(ingestion.ingest_batch)
    monkeypatch.setattr(ingestion, "ingest_batch", held)
    recs = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 6)
    answers = post_held_then_together(client, held, recs,
                                       meanwhile=lambda: client.get("/healthz").status_code == 200)
    assert [len(args[2]) for args in held.calls] == [1, 5]  # one transaction for the five that waited
    for p, r in answers.items():
        assert r.status_code == 200, r.text
        assert (r.json()["run_id"], r.json()["process_index"], r.json()["keys"]) == ("r1", p, 2)
    assert state.reports.settled(PATIENCE_S)  # the batch's misses are explained after its answers
    job = client.get("/v1/caches/demo/jobs/storm", headers=H_READ).json()
    assert job["processes"] == 6 and job["misses"] == 6
    assert all(m["cause"] is not None for m in job["missed"])
    metrics = client.get("/metrics").text
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith('jaxcache_misses_total{cache="demo"'))
    assert counted == 6  # each process's miss once


def test_a_full_queue_answers_503_with_retry_after_and_the_record_file_is_ingested_by_rescan(
        tmp_path, cache_copy, monkeypatch, jax_caches):
    from jaxcache.service.ingestion import reports as ingestion
    from reports_support import put_record, rescan

    held = HeldOnce(ingestion.ingest_batch)
    monkeypatch.setattr(ingestion, "ingest_batch", held)
    recs = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 3)
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, report_queue=1))) as c:
        settled(c)
        state = c.app.state.jaxcache
        answers: dict[int, Any] = {}
        first = post_in_thread(c, recs[0], answers)
        assert held.entered.wait(PATIENCE_S)
        second = post_in_thread(c, recs[1], answers)
        wait_for(lambda: len(state.reports) == 1)
        # The job writes its record file as well (the client always does), and posts: the queue is full.
        put_record(cache_copy, recs[2])
        refused = c.post("/v1/reports?cache=demo", content=recs[2].to_json(),
                         headers={**H_REPORT, "content-type": "application/json"})
        assert refused.status_code == 503
        assert int(refused.headers["retry-after"]) >= 1
        assert "JAXCACHE_REPORT_QUEUE=1" in refused.json()["detail"]
        held.release()
        for t in (first, second):
            t.join(PATIENCE_S)
        assert {p: r.status_code for p, r in answers.items()} == {0: 200, 1: 200}
        assert rescan(c)["records_ingested"] == 1  # the refused record, from its file
        job = c.get("/v1/caches/demo/jobs/storm", headers=H_READ).json()
        assert job["processes"] == 3 and job["misses"] == 3


def test_the_writer_waits_a_moment_for_records_still_arriving(client, monkeypatch, jax_caches):
    """A record queued while another request still reads or parses its own waits for it: one batch of both (small
    batches cost half as much again a record). A lone record does not wait (the other tests' answers)."""
    from jaxcache.service.api import reports as route
    from jaxcache.service.ingestion import queue
    from jaxcache.service.ingestion import reports as ingestion

    monkeypatch.setattr(queue, "LINGER_S", PATIENCE_S)  # the wait ends when the record is queued, not at its bound
    monkeypatch.setattr(route, "PARSERS", 2)  # the second record is parsed while the first one still is
    calls = HeldOnce(ingestion.ingest_batch)
    calls.release()  # nothing held: every call kept
    monkeypatch.setattr(ingestion, "ingest_batch", calls)
    parsing, go_on = threading.Event(), threading.Event()
    accept = route._accept

    def slow_accept(state, body, cache):
        if b'"process_index":0' in body.replace(b" ", b""):
            parsing.set()
            assert go_on.wait(PATIENCE_S)
        return accept(state, body, cache)

    monkeypatch.setattr(route, "_accept", slow_accept)
    recs = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 2)
    answers: dict[int, Any] = {}
    slow = post_in_thread(client, recs[0], answers)
    assert parsing.wait(PATIENCE_S)
    quick = post_in_thread(client, recs[1], answers)
    state = client.app.state.jaxcache
    wait_for(lambda: len(state.reports) == 1)  # queued; the writer waits for the record still being parsed
    assert calls.calls == []
    go_on.set()
    for t in (slow, quick):
        t.join(PATIENCE_S)
    assert {p: r.status_code for p, r in answers.items()} == {0: 200, 1: 200}
    assert [len(args[2]) for args in calls.calls] == [2]


def test_a_storms_misses_wait_for_a_quiet_moment_and_a_lone_record_explains_only_its_own(client, monkeypatch,
                                                                                          jax_caches):
    """Explaining holds the cache's write lock in every worker: between a storm's requests, a worker explains
    nothing but a lone record's own misses (read-your-writes), and the rest once no record came for a while; records
    alone after a batch of several, with no quiet moment since, are part of the storm (on PostgreSQL the copies of
    one alone cost 0.5 s). (Runs
    of one process each: a run's processes share their misses' rows, so a job's later processes find them
    explained.)"""
    import time

    from jaxcache.service.ingestion import queue
    from jaxcache.service.ingestion import reports as ingestion

    monkeypatch.setattr(queue, "QUIET_S", PATIENCE_S)  # no quiet moment during the test
    state = client.app.state.jaxcache
    held = HeldOnce(ingestion.ingest_batch)
    monkeypatch.setattr(ingestion, "ingest_batch", held)
    train, at = keys_of(jax_caches["zstd"])["jit_train_step"], time.time() - 120
    recs = [run("storm", f"r{p}", [compiled(train, 3.0, at)], at=at + 60, process_index=p, process_count=8)
            for p in range(8)]  # (by process index: the answers are told apart by it)
    answers = post_held_then_together(client, held, recs[:6])
    for late in recs[6:]:  # each alone, but after a batch of several with no quiet moment since: in the storm
        post_in_thread(client, late, answers).join(PATIENCE_S)
    assert {p: r.status_code for p, r in answers.items()} == dict.fromkeys(range(8), 200)
    # The first went alone (explained before its answer); the batch of five and the two after it wait for quiet.
    assert _explained_runs(state) == ({"r0"}, 8)
    monkeypatch.setattr(queue, "QUIET_S", 0.0)
    with state.reports._cond:  # the writer waits with the old bound: wake it to read the new one
        state.reports._cond.notify_all()
    assert state.reports.settled(PATIENCE_S)
    assert _explained_runs(state) == ({f"r{p}" for p in range(8)}, 8)


def test_a_runs_processes_share_its_misses_explanation(client):
    """A job's processes that compile the same key share one usage row of their run and its explanation: the row
    counts each of them (``missed``), and jaxcache_misses_total counts each process once."""
    from sqlalchemy import select

    from jaxcache.service.catalog.models import UsageRow

    state = client.app.state.jaxcache
    ghost = "jit_ghost-" + "d" * 64  # no entry of its function: its miss is new_program whenever the test runs
    for rec in _job(ghost, 5):
        r = client.post("/v1/reports?cache=demo", content=rec.to_json(),
                        headers={**H_REPORT, "content-type": "application/json"})
        assert r.status_code == 200, r.text
    assert state.reports.settled(PATIENCE_S)
    with state.catalog.reader() as conn:
        (row,) = conn.execute(select(UsageRow.processes, UsageRow.missed, UsageRow.counted, UsageRow.cause,
                                     UsageRow.compiles).where(UsageRow.cache == "demo", UsageRow.run_id == "r1",
                                                              UsageRow.key == ghost)).all()
    assert tuple(row) == (5, 5, 5, "new_program", 5)
    counted = re.search(r'^jaxcache_misses_total{cache="demo",cause="new_program"} (\S+)$',
                        client.get("/metrics").text, re.M)
    assert counted is not None and float(counted.group(1)) == 5.0


def _explained_runs(state) -> tuple[set[str], int]:
    """The runs whose miss is explained, and how many runs missed."""
    from sqlalchemy import select

    from jaxcache.service.catalog.models import UsageRow

    with state.catalog.reader() as conn:
        rows = conn.execute(select(UsageRow.run_id, UsageRow.cause).where(
            UsageRow.cache == "demo", UsageRow.event.in_(("write", "compiled")))).all()
    return {r for r, cause in rows if cause is not None}, len(rows)


def test_a_storms_copies_on_entry_rows_wait_for_a_quiet_moment_and_a_lone_records_are_made_before_its_answer(
        client, monkeypatch, jax_caches):
    """Every batch of a job's records updates the same keys' aggregates; on PostgreSQL each update of an entry row
    writes all its indexes again. So a batch's copies onto entry rows wait for a quiet moment (key_stats is
    current at once), and a lone record's are made in its own transaction."""
    import time

    from jaxcache.service.ingestion import queue
    from jaxcache.service.ingestion import reports as ingestion

    monkeypatch.setattr(queue, "QUIET_S", PATIENCE_S)  # no quiet moment, and no copy due, during the test
    monkeypatch.setattr(queue, "COPY_DEFER_S", PATIENCE_S)
    state = client.app.state.jaxcache
    held = HeldOnce(ingestion.ingest_batch)
    monkeypatch.setattr(ingestion, "ingest_batch", held)
    train, at = keys_of(jax_caches["zstd"])["jit_train_step"], time.time() - 60
    recs = [run("copies", "c1", [hit(train, 1, at)], at=at + 30, process_index=p, process_count=7) for p in range(7)]
    answers = post_held_then_together(client, held, recs[:6])
    assert [len(args[2]) for args in held.calls] == [1, 5]
    assert _hits(state, train) == (6, 1)  # the aggregates have the batch; its entry row only the first, lone one
    monkeypatch.setattr(queue, "QUIET_S", 0.0)
    with state.reports._cond:  # the writer waits with the old bound: wake it to read the new one
        state.reports._cond.notify_all()
    assert state.reports.settled(PATIENCE_S) and _hits(state, train) == (6, 6)
    monkeypatch.setattr(queue, "QUIET_S", PATIENCE_S)
    lone = post_in_thread(client, recs[6], answers)
    lone.join(PATIENCE_S)
    assert answers[6].status_code == 200 and _hits(state, train) == (7, 7)  # in the lone record's transaction


def _hits(state, key: str) -> tuple[int, int]:
    """The key's hits in key_stats, and as its entry row's copy says."""
    from sqlalchemy import select

    from jaxcache.service.catalog.models import EntryRow, KeyStatsRow

    with state.catalog.reader() as conn:
        stats = conn.execute(select(KeyStatsRow.hits).where(KeyStatsRow.cache == "demo", KeyStatsRow.key == key))
        entry = conn.execute(select(EntryRow.hits).where(EntryRow.cache == "demo", EntryRow.key == key,
                                                         EntryRow.kind == "entry"))
        return stats.scalar_one(), entry.scalar_one()
