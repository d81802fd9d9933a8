"""How the service serves requests: catalog work and body parsing happen in worker threads, so one slow request
never stalls the event loop (``/healthz`` and everything else keep answering while it runs).

Nothing here measures a time: a slow request is one the test holds (its catalog query or its parsing waits on an
event), and the assertions are about what finishes before what."""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache import records
from jaxcache.service.app import create_app
from jaxcache.service.catalog import queries
from reports_support import H_READ, H_REPORT, compiled, hit, keys_of, run, settings

#: Bound on waiting for a held request; the assertions never depend on it.
PATIENCE_S = 60

#: The only ``async def`` routes: none touches the catalog or storage, or parses more than a form of at most
#: JAXCACHE_MAX_BODY_BYTES; the reports route reads its body on the loop and parses it in a thread.
ASYNC_ROUTES = {
    "healthz",  # answers a constant
    "list_entries",  # its query and JSON in one of the threads kept for listings (State.read)
    "ingest_report",  # awaits the body, then parses and ingests in worker threads
    "swagger_ui", "redoc",  # render a page of links to packaged assets
    "login", "logout",  # a small form and a token's hash
    "prune_form", "prune_apply",  # a token's hash; catalog work and rendering through run_in_threadpool
}


def test_only_routes_that_do_no_blocking_work_run_on_the_event_loop(tmp_path, cache_copy):
    """A new ``async def`` route that queried the catalog would stall every request while it ran: such routes
    are plain ``def`` (FastAPI runs them in its thread pool), and this list is the exceptions, each checked."""
    app = create_app(settings(tmp_path, {"demo": str(cache_copy)}))
    routes = list(_api_routes(app.routes))
    assert len(routes) > 30  # every router's routes were found
    on_loop = {r.endpoint.__name__ for r in routes if inspect.iscoroutinefunction(r.endpoint)}
    assert on_loop == ASYNC_ROUTES


def _api_routes(routes: list) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        included = getattr(route, "original_router", None)  # an included router (FastAPI >= 0.16x)
        if included is not None:
            yield from _api_routes(included.routes)


class Held:
    """Wraps a function so that calls wait until :meth:`release` (each call says it has begun)."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        assert self.released.wait(PATIENCE_S), "the test never released the held call"
        return self.real(*args, **kwargs)

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def client(tmp_path, cache_copy) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}))) as c:
        settled(c)
        yield c


def _while_held(client: TestClient, held: Held, slow: Callable[[], Any]) -> tuple[list[str], Any]:
    """Start ``slow`` (a request that reaches ``held``), ask /healthz and a cached-nothing read meanwhile, then
    release it; the order in which they finished, and the slow request's response."""
    finished: list[str] = []
    answer: dict[str, Any] = {}

    def slow_request() -> None:
        try:
            answer["response"] = slow()
        finally:  # a loop stalled by it makes the held call give up: the order below says so
            finished.append("slow")

    thread = threading.Thread(target=slow_request)
    thread.start()
    try:
        assert held.entered.wait(PATIENCE_S), "the slow request never reached the held call"
        health = client.get("/healthz")
        assert health.status_code == 200
        finished.append("healthz")
        assert client.get("/v1/caches", headers=H_READ).status_code == 200  # the catalog itself is free
        finished.append("caches")
    finally:
        held.release()
        thread.join(PATIENCE_S)
    return finished, answer.get("response")


def test_healthz_answers_while_a_listing_waits_for_its_catalog_query(client, monkeypatch):
    held = Held(queries.list_entries)
    monkeypatch.setattr(queries, "list_entries", held)
    finished, response = _while_held(
        client, held, lambda: client.get("/v1/caches/demo/entries?limit=5", headers=H_READ))
    assert finished == ["healthz", "caches", "slow"]
    assert response is not None and response.status_code == 200 and response.json()["entries"]


def test_healthz_answers_while_a_large_report_is_parsed(client, monkeypatch, jax_caches):
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    # A process that touched thousands of keys: a body of megabytes.
    many = [hit(f"jit_f{i}-{i:064x}", 1, 1_700_000_000.0 + i) for i in range(10_000)]
    record = run("big-job", "big-run", [hit(train, 2, 1_700_000_000.0), *many])
    body = record.to_json()
    assert len(body) > 1_000_000
    held = Held(records.parse)
    monkeypatch.setattr(records, "parse", held)
    finished, response = _while_held(client, held, lambda: client.post(
        "/v1/reports?cache=demo", content=body, headers={**H_REPORT, "content-type": "application/json"}))
    assert finished == ["healthz", "caches", "slow"]
    assert response is not None and response.status_code == 200, response.text
    assert response.json()["keys"] == len(record.keys)


def test_records_arriving_together_are_parsed_one_at_a_time(client, monkeypatch):
    """Each parsing thread more takes the interpreter from the event loop: a process parses one record at a time
    (api/reports.PARSERS), and the others wait for it without holding the loop."""
    import time

    parsing: list[int] = []  # how many parses ran, as each began
    now = [0]
    count = threading.Lock()
    held = Held(records.parse)

    def counted(*args: Any, **kwargs: Any) -> Any:
        with count:
            now[0] += 1
            parsing.append(now[0])
        try:
            return held(*args, **kwargs)
        finally:
            with count:
                now[0] -= 1

    monkeypatch.setattr(records, "parse", counted)
    answers: dict[int, Any] = {}
    recs = [run("parse", f"r{p}", [], process_index=p, process_count=3) for p in range(3)]
    threads = [_post_in_thread(client, r, answers) for r in recs]
    assert held.entered.wait(PATIENCE_S)
    _wait_for(lambda: client.app.state.jaxcache.reports._arriving == 3)  # all three read, one parsing
    deadline = time.monotonic() + 0.5  # a moment for a second parse to begin, were it let in (not an assertion)
    while now[0] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.get("/healthz").status_code == 200  # the others wait off the loop
    held.release()
    for t in threads:
        t.join(PATIENCE_S)
    assert {p: r.status_code for p, r in answers.items()} == dict.fromkeys(range(3), 200)
    assert parsing == [1, 1, 1]  # never a second parse while one ran


# --------------------------------------------------------------------------------------------------------------
# Reports: one writer per process, in batches, and 503 when its queue is full


class HeldOnce(Held):
    """The first call waits for :meth:`release`; the others go through at once. Every call's arguments kept."""

    def __init__(self, real: Callable[..., Any]) -> None:
        super().__init__(real)
        self.calls: list[tuple] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(args)
        if len(self.calls) == 1:
            return super().__call__(*args, **kwargs)
        return self.real(*args, **kwargs)


def _post_in_thread(client: TestClient, record, out: dict) -> threading.Thread:
    def send() -> None:
        out[record.process_index] = client.post("/v1/reports?cache=demo", content=record.to_json(),
                                                headers={**H_REPORT, "content-type": "application/json"})

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def _wait_for(condition: Callable[[], bool]) -> None:
    """Bound on waiting for the service's threads; not a timing assertion."""
    import time

    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, "the service never got there"
        time.sleep(0.01)


def _job(train: str, processes: int) -> list:
    import time

    from reports_support import compiled, write

    at = time.time() - 120
    return [run("storm", "r1", [write(train, 3.0, at) if p == 0 else compiled(train, 3.0, at),
                                hit(f"jit_other-{p:064x}", 1, at)], at=at + 60, process_index=p,
                process_count=processes) for p in range(processes)]


def _post_held_then_together(client: TestClient, held: HeldOnce, recs: list,
                             meanwhile: Callable[[], bool] = lambda: True) -> dict[int, Any]:
    """POST the first record, whose batch ``held`` keeps, then the others, which queue behind it; release it once
    they all wait (and ``meanwhile`` holds); the answers by process index."""
    answers: dict[int, Any] = {}
    first = _post_in_thread(client, recs[0], answers)
    assert held.entered.wait(PATIENCE_S)
    rest = [_post_in_thread(client, r, answers) for r in recs[1:]]
    _wait_for(lambda: len(client.app.state.jaxcache.reports) == len(rest))  # behind the writer, which holds the first
    assert meanwhile()
    held.release()
    for t in [first, *rest]:
        t.join(PATIENCE_S)
    return answers


def test_reports_posted_together_are_ingested_in_one_batch_each_answered_with_its_own(client, monkeypatch,
                                                                                     jax_caches):
    from jaxcache.service.ingestion import reports as ingestion

    state = client.app.state.jaxcache
    held = HeldOnce(ingestion.ingest_batch)
    monkeypatch.setattr(ingestion, "ingest_batch", held)
    recs = _job(keys_of(jax_caches["zstd"])["jit_train_step"], 6)
    answers = _post_held_then_together(client, held, recs,
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
        first = _post_in_thread(c, recs[0], answers)
        assert held.entered.wait(PATIENCE_S)
        second = _post_in_thread(c, recs[1], answers)
        _wait_for(lambda: len(state.reports) == 1)
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
    slow = _post_in_thread(client, recs[0], answers)
    assert parsing.wait(PATIENCE_S)
    quick = _post_in_thread(client, recs[1], answers)
    state = client.app.state.jaxcache
    _wait_for(lambda: len(state.reports) == 1)  # queued; the writer waits for the record still being parsed
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
    answers = _post_held_then_together(client, held, recs[:6])
    for late in recs[6:]:  # each alone, but after a batch of several with no quiet moment since: in the storm
        _post_in_thread(client, late, answers).join(PATIENCE_S)
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
    answers = _post_held_then_together(client, held, recs[:6])
    assert [len(args[2]) for args in held.calls] == [1, 5]
    assert _hits(state, train) == (6, 1)  # the aggregates have the batch; its entry row only the first, lone one
    monkeypatch.setattr(queue, "QUIET_S", 0.0)
    with state.reports._cond:  # the writer waits with the old bound: wake it to read the new one
        state.reports._cond.notify_all()
    assert state.reports.settled(PATIENCE_S) and _hits(state, train) == (6, 6)
    monkeypatch.setattr(queue, "QUIET_S", PATIENCE_S)
    lone = _post_in_thread(client, recs[6], answers)
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
