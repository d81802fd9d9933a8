"""POSTed run records into the catalog through one writer thread per process, in batches.

A job's processes post their records within seconds of each other, and each record of a cache takes the same write
transaction. The request parses its record in a thread, hands it over and waits without holding one; the writer
ingests everything queued for the cache in one transaction and answers each request with its own result. The
busier the service, the bigger the batches; a lone record goes in at once. A full queue answers 503 with
Retry-After instead of letting requests pile up (the record file reaches the catalog by rescan). A batch's misses
are explained after its answers, once nothing waits (a lone record's before its answer, so that a reader right
after the POST sees them). docs/service.md, "Serving" and "Report storms"."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jaxcache.errors import JaxcacheError
from jaxcache.records import RunRecord
from jaxcache.service.ingestion.explain import Pending
from jaxcache.service.ingestion.reports import IngestResult, PendingMisses

log = logging.getLogger("jaxcache.service")

#: A batch stops growing at this many records or keys: other writers of the cache (rescans, other replicas) wait
#: for its transaction, and a record's answer for the whole batch.
MAX_BATCH_RECORDS = 256
MAX_BATCH_KEYS = 100_000
#: Misses wait at most this long, or this many, for a moment with no record waiting: long enough for a storm (a
#: 1,000-process job's end: 60,000 misses) to be ingested before its misses are explained, since explaining holds
#: the cache's write lock in every worker and replica. A pending miss costs about 150 bytes.
DEFER_S = 30.0
MAX_DEFERRED = 200_000
#: Misses explained at once, between batches of records (which wait for them): one history read for a job's misses
#: of the same keys, a short enough stall.
EXPLAIN_CHUNK = 5000

Batch = Callable[[str, Sequence[RunRecord], PendingMisses], list[IngestResult]]
One = Callable[[str, RunRecord], IngestResult]
Explain = Callable[[str, list[Pending]], None]


class QueueFullError(JaxcacheError):
    """The process's ingestion queue is full; ``retry_after_s``: about when it will have room."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class _Item:
    cache: str
    record: RunRecord
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[IngestResult]


class ReportQueue:
    """Records waiting for the catalog, and the thread that ingests them (started with the first record)."""

    def __init__(self, batch: Batch, one: One, explain: Explain, *, max_queued: int) -> None:
        self._batch, self._one, self._explain, self.max_queued = batch, one, explain, max_queued
        self._later: dict[str, PendingMisses] = {}  # by cache; only the writer thread touches them
        self._later_since: dict[str, float] = {}
        self._items: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = False  # the writer is ingesting or explaining
        self._seconds_per_record = 0.01  # a moving average, for Retry-After

    def __len__(self) -> int:
        return len(self._items)

    def check_room(self) -> None:
        """Raise QueueFullError now, before the request's body is parsed, when no record would be taken."""
        if len(self._items) >= self.max_queued:
            raise self._full()

    async def ingest(self, cache: str, record: RunRecord) -> IngestResult:
        """Ingest ``record`` into ``cache`` with whatever else is queued; its own result, or its own error."""
        loop = asyncio.get_running_loop()
        item = _Item(cache, record, loop, loop.create_future())
        with self._cond:
            if self._closed:
                raise JaxcacheError("the service is stopping: send the record again to another replica, or let "
                                    "the next rescan read its file")
            if len(self._items) >= self.max_queued:
                raise self._full()
            self._items.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jaxcache-reports", daemon=True)
                self._thread.start()
            self._cond.notify_all()  # the writer, among those who wait for it to settle
        return await item.future

    def settled(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until every record taken is ingested and its misses explained."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._items or self._later or self._busy), timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        """Ingest what is queued, then stop the thread (waits at most ``timeout_s``)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # the writer, among those who wait for it to settle
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _full(self) -> QueueFullError:
        wait = max(1, min(60, math.ceil(len(self._items) * self._seconds_per_record)))
        return QueueFullError(f"the service has {len(self._items)} run records waiting for its catalog (at most "
                              f"JAXCACHE_REPORT_QUEUE={self.max_queued}): try again in {wait} s; the record file "
                              "under the cache root reaches the catalog at the next rescan anyway", wait)

    def _take(self) -> list[_Item]:
        """The oldest record and every other queued for its cache, within the batch's limits (called locked)."""
        first = self._items.popleft()
        batch, keys, rest = [first], len(first.record.keys), deque[_Item]()
        while self._items and len(batch) < MAX_BATCH_RECORDS and keys < MAX_BATCH_KEYS:
            item = self._items.popleft()
            if item.cache == first.cache:
                batch.append(item)
                keys += len(item.record.keys)
            else:
                rest.append(item)
        rest.extend(self._items)
        self._items = rest
        return batch

    def _run(self) -> None:
        records_until = 0.0  # after explaining while records waited, records have the writer as long again
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                if not self._later:
                    self._cond.wait_for(lambda: self._items or self._closed)
                if not self._items and not self._later:
                    return  # closed, and everything ingested and explained
                self._busy = True
                # Misses that have waited long share the writer with waiting records, time for time.
                due = self._explain_due() and time.monotonic() >= records_until
                batch = self._take() if self._items and not due else None
            if batch is None:
                began = time.monotonic()
                self._explain_some()
                records_until = 2 * time.monotonic() - began
                continue
            started = time.monotonic()
            outcomes = self._outcomes(batch)
            while len(batch) == 1 and self._later and not self._items:
                self._explain_some()  # a lone record: explained before its answer, so a reader right after sees it
            for item, outcome in zip(batch, outcomes, strict=True):
                try:
                    item.loop.call_soon_threadsafe(_settle, item.future, outcome)
                except RuntimeError:  # its loop has closed: nobody waits for it any more
                    pass
            per_record = (time.monotonic() - started) / len(batch)
            self._seconds_per_record = 0.8 * self._seconds_per_record + 0.2 * per_record

    def _explain_due(self) -> bool:
        if not self._later:
            return False
        return (time.monotonic() - min(self._later_since.values()) >= DEFER_S
                or sum(len(p) for p in self._later.values()) >= MAX_DEFERRED)

    def _explain_some(self) -> None:
        """One transaction's worth of the misses that have waited longest."""
        cache = min(self._later_since, key=self._later_since.__getitem__)
        held = self._later[cache]
        todo = held.take(EXPLAIN_CHUNK)
        if not len(held):
            del self._later[cache], self._later_since[cache]
        if not todo:
            return
        try:
            self._explain(cache, todo)
        except Exception as exc:  # noqa: BLE001 - the rows stay unexplained (shown so); the writer goes on
            log.warning("explaining %d misses of %s failed (they stay unexplained until their records are "
                        "ingested again): %s", len(todo), cache, exc)

    def _outcomes(self, batch: list[_Item]) -> list[IngestResult | BaseException]:
        cache, records = batch[0].cache, [i.record for i in batch]
        later = self._later.setdefault(cache, PendingMisses())
        self._later_since.setdefault(cache, time.monotonic())
        try:
            return list(self._batch(cache, records, later))
        except Exception as exc:  # noqa: BLE001 - answered below, record by record
            if len(batch) == 1:
                return [exc]
            log.info("a batch of %d run records for %s failed (%s): ingesting them one at a time", len(batch),
                     cache, exc)
        outcomes: list[IngestResult | BaseException] = []
        for record in records:  # one bad record, or a database error the next transaction may not meet
            try:
                outcomes.append(self._one(cache, record))
            except Exception as exc:  # noqa: BLE001 - that request's own answer
                outcomes.append(exc)
        return outcomes


def _settle(future: asyncio.Future[IngestResult], outcome: IngestResult | BaseException) -> None:
    if future.done():  # the request went away (its client disconnected)
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
