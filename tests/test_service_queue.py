"""The report queue's writer thread with stand-ins for the catalog: a batch's copies onto entry rows are made once
nothing arrives, a copy that fails is made again after a pause, and a service stopping drops what it cannot copy
(saying so) instead of trying for ever."""

from __future__ import annotations

import asyncio
import logging
import time

from jaxcache.service.ingestion import queue
from jaxcache.service.ingestion.packed import report_of
from jaxcache.service.ingestion.reports import IngestResult, PendingMisses
from reports_support import hit, run

PATIENCE_S = 60


class Catalog:
    """What the queue calls, recorded; copying fails ``failures`` times first."""

    def __init__(self, failures: int) -> None:
        self.failures, self.batches, self.copied = failures, [], []

    def batch(self, cache: str, recs, later: PendingMisses, copies: set[str] | None) -> list[IngestResult]:
        self.batches.append(len(recs))
        assert copies is not None  # several records: their copies wait
        copies.update(key for r in recs for key in r.keys)
        return [IngestResult(cache, r.run_id, r.process_index, len(r.keys), stale=False) for r in recs]

    def one(self, cache: str, record) -> IngestResult:
        raise AssertionError("the batch did not fail")

    def explain(self, cache: str, pending) -> None:
        pass

    def copy(self, cache: str, keys: set[str]) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the catalog is down")
        self.copied.append((cache, set(keys)))


def _storm(q: queue.ReportQueue, recs) -> list:
    async def main() -> list:
        with q._cond:  # the writer waits for this lock: every record queues before it takes a batch
            tasks = [asyncio.ensure_future(q.ingest("demo", r)) for r in recs]
            while len(q) < len(recs):
                await asyncio.sleep(0)
        return await asyncio.gather(*tasks)

    return asyncio.run(main())


def _records() -> list:
    at = time.time()
    return [report_of(run("storm", "r1", [hit("jit_a-" + "0" * 64, 1, at), hit(f"jit_b-{p:064x}", 1, at)], at=at,
                          process_index=p, process_count=3)) for p in range(3)]


def test_a_failed_copy_is_made_again_after_a_pause(monkeypatch, caplog):
    monkeypatch.setattr(queue, "QUIET_S", 0.0)
    monkeypatch.setattr(queue, "COPY_RETRY_S", 0.01)
    catalog = Catalog(failures=2)
    q = queue.ReportQueue(catalog.batch, catalog.one, catalog.explain, catalog.copy, max_queued=10)
    recs = _records()
    with caplog.at_level(logging.WARNING, logger="jaxcache.service"):
        results = _storm(q, recs)
        assert q.settled(PATIENCE_S)
    assert catalog.batches == [3] and [r.process_index for r in results] == [0, 1, 2]
    assert catalog.copied == [("demo", {key for r in recs for key in r.keys})] and catalog.failures == 0
    assert sum("trying again" in r.getMessage() for r in caplog.records) == 2
    q.close()


def test_a_stopping_service_drops_the_copies_it_cannot_make(monkeypatch, caplog):
    monkeypatch.setattr(queue, "QUIET_S", PATIENCE_S)  # the copies wait: only closing makes them
    monkeypatch.setattr(queue, "COPY_DEFER_S", PATIENCE_S)
    catalog = Catalog(failures=1_000_000)
    q = queue.ReportQueue(catalog.batch, catalog.one, catalog.explain, catalog.copy, max_queued=10)
    _storm(q, _records())
    with caplog.at_level(logging.WARNING, logger="jaxcache.service"):
        q.close(timeout_s=PATIENCE_S)
    assert q._thread is not None and not q._thread.is_alive() and catalog.failures == 1_000_000 - 1  # tried once
    assert any("the service is stopping" in r.getMessage() for r in caplog.records)


def test_in_a_storm_the_writer_waits_for_a_batch_of_records_it_cannot_see_coming(monkeypatch):
    """The report writer process cannot see the bodies its workers still read: after a batch of several, it waits
    (at most STORM_LINGER_S) for STORM_BATCH records instead of taking each as it comes, at a batch's fixed cost
    each."""
    monkeypatch.setattr(queue, "QUIET_S", PATIENCE_S)  # the storm goes on
    monkeypatch.setattr(queue, "COPY_DEFER_S", PATIENCE_S)
    monkeypatch.setattr(queue, "STORM_BATCH", 4)
    monkeypatch.setattr(queue, "STORM_LINGER_S", PATIENCE_S)
    catalog = Catalog(failures=0)
    q = queue.ReportQueue(catalog.batch, catalog.one, catalog.explain, catalog.copy, max_queued=10)
    _storm(q, _records())
    at = time.time()
    later = [report_of(run("storm", "r1", [hit("jit_a-" + "0" * 64, 2, at)], at=at, process_index=p,
                           process_count=8)) for p in range(3, 7)]

    async def one_at_a_time() -> list:
        tasks = []
        for r in later:
            tasks.append(asyncio.ensure_future(q.ingest("demo", r)))
            await asyncio.sleep(0.05)
        return await asyncio.gather(*tasks)

    results = asyncio.run(one_at_a_time())
    assert catalog.batches == [3, 4] and [r.process_index for r in results] == [3, 4, 5, 6]
    q.close(timeout_s=PATIENCE_S)
