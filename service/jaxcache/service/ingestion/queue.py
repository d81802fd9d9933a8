"""POSTed run records into the catalog through one writer thread per process, in batches.

A job's processes post their records within seconds of each other, and each record of a cache takes the same write
transaction. The request parses its record in a thread, hands it over and waits without holding one; the writer
ingests everything queued for the cache in one transaction and answers each request with its own result. The
busier the service, the bigger the batches; a lone record goes in at once. A full queue answers 503 with
Retry-After instead of letting requests pile up (the record file reaches the catalog by rescan). A batch's misses
are explained after its answers, once nothing waits, and its keys' aggregates copied onto their entry rows (a lone
record's both before its answer, so that a reader right after the POST sees them). docs/service.md, "Serving" and
"Report storms"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from jaxcache.errors import JaxcacheError
from jaxcache.service.ingestion.explain import Pending
from jaxcache.service.ingestion.packed import Report
from jaxcache.service.ingestion.reports import IngestResult, PendingMisses

log = logging.getLogger("jaxcache.service")

#: A batch stops growing at this many records or keys: other writers of the cache (rescans, other replicas) wait
#: for its transaction, and a record's answer for the whole batch.
MAX_BATCH_RECORDS = 256
MAX_BATCH_KEYS = 100_000
#: A writer with fewer records than a batch takes waits at most this long for requests whose records are still
#: arriving (body read, parsed): a batch of 64 final records costs 6.6 ms a record, one of 8 costs 9.6 ms.
LINGER_S = 0.05
#: In a storm, a writer that knows of no record on its way (the report writer process cannot see the bodies its
#: workers still read) waits at most this long for this many records before it takes a batch: a batch's fixed
#: cost (its keys' usage rows and aggregates, read and written once) is about 34 ms on PostgreSQL, and a writer
#: that took what was queued took batches of a handful, spending twice the CPU a record that a batch of 32 does,
#: CPU the workers parsing the next records needed (bench/reports.py).
STORM_BATCH = 32
STORM_LINGER_S = 0.2
#: Misses are explained once no record has arrived for this long (or once they are due): between two requests of a
#: storm, one worker's queue is empty while the others' records are on their way, and explaining holds the
#: cache's write lock in every worker.
QUIET_S = 0.5
#: Misses wait at most this long, or this many, for a moment with no record waiting: long enough for a storm (a
#: 1,000-process job's end: 60,000 misses) to be ingested before its misses are explained, since explaining holds
#: the cache's write lock in every worker and replica. A pending miss costs about 150 bytes.
DEFER_S = 60.0
MAX_DEFERRED = 200_000
#: Misses explained at once, between batches of records (which wait for them): one history read for a job's misses
#: of the same keys, a short enough stall.
EXPLAIN_CHUNK = 5000
#: A storm's batches leave their keys' copies on entry rows (hits, last use, the writer) for the quiet moment, or
#: for at most this long: every batch of a job's records touches the same keys, and on PostgreSQL each update of an
#: entry row writes all of its indexes again (bench/reports.py: half of a storm's time, listings slowed by the dead
#: rows; once ingesting a record cost a tenth of what it did, each round of copies, every 5 s, still cost a fifth
#: of a storm's time there). A lone record's copies are made in its own transaction, before its answer.
COPY_DEFER_S = 30.0
COPY_RETRY_S = 1.0

Batch = Callable[[str, Sequence[Report], PendingMisses, set[str] | None], list[IngestResult]]
One = Callable[[str, Report], IngestResult]
Explain = Callable[[str, list[Pending]], None]
Copy = Callable[[str, set[str]], None]


class QueueFullError(JaxcacheError):
    """The process's ingestion queue is full; ``retry_after_s``: about when it will have room."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class Arrival:
    """A request bringing a record (:meth:`ReportQueue.arriving`); ``queued`` once its record is."""

    queued: bool = False


@dataclass(slots=True)
class _Item:
    cache: str
    record: Report
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[IngestResult]


class ReportQueue:
    """Records waiting for the catalog, and the thread that ingests them (started with the first record)."""

    def __init__(self, batch: Batch, one: One, explain: Explain, copy: Copy, *, max_queued: int) -> None:
        self._batch, self._one, self._explain, self._copy = batch, one, explain, copy
        self.max_queued = max_queued
        self._later: dict[str, PendingMisses] = {}  # by cache; only the writer thread touches them
        self._later_since: dict[str, float] = {}
        self._copies: dict[str, set[str]] = {}  # keys whose entry rows' copies are due, by cache (the writer's)
        self._copies_since = 0.0
        self._items: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = False  # the writer is ingesting or explaining
        self._arriving = 0  # requests reading or parsing a record, not queued yet
        self._last_activity = 0.0  # when a record was last queued or answered (monotonic)
        self._answered_at = 0.0  # when a batch was last answered
        self._storm = False  # a batch of several came since the last quiet moment
        self._seconds_per_record = 0.01  # a moving average, for Retry-After

    def __len__(self) -> int:
        return len(self._items)

    def check_room(self) -> None:
        """Raise QueueFullError now, before the request's body is parsed, when no record would be taken."""
        if len(self._items) >= self.max_queued:
            raise self._full()

    @contextlib.contextmanager
    def arriving(self) -> Iterator[Arrival]:
        """Count a request as bringing a record while it reads and parses it (pass the arrival to :meth:`ingest`):
        the writer waits a moment for such records to join its batch."""
        arrival = Arrival()
        with self._cond:
            self._arriving += 1
        try:
            yield arrival
        finally:
            with self._cond:
                if not arrival.queued:
                    self._arriving -= 1
                    self._cond.notify_all()

    async def ingest(self, cache: str, record: Report, arrival: Arrival | None = None) -> IngestResult:
        """Ingest ``record`` into ``cache`` with whatever else is queued; its own result, or its own error."""
        loop = asyncio.get_running_loop()
        item = _Item(cache, record, loop, loop.create_future())
        with self._cond:
            if arrival is not None and not arrival.queued:
                arrival.queued = True
                self._arriving -= 1
            if self._closed:
                raise JaxcacheError("the service is stopping: send the record again to another replica, or let "
                                    "the next rescan read its file")
            if len(self._items) >= self.max_queued:
                raise self._full()
            self._items.append(item)
            self._last_activity = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jaxcache-reports", daemon=True)
                self._thread.start()
            self._cond.notify_all()  # the writer, among those who wait for it to settle
        return await item.future

    def settled(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until every record taken is ingested, its misses explained and its keys'
        copies on entry rows made."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._items or self._later or self._copies or self._busy),
                                       timeout_s)

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
                if not self._later and not self._copies:
                    self._cond.wait_for(lambda: self._items or self._closed)
                elif not self._items:
                    self._cond.wait_for(lambda: self._items or self._closed or self._quiet(), self._until_quiet())
                if not self._items and not self._later and not self._copies:
                    return  # closed, and everything ingested, explained and copied
                if self._quiet():
                    self._storm = False  # the next record alone is a lone one
                copy = bool(self._copies) and (self._closed or self._quiet() or self._copies_due())
                if not self._items and not copy and not (self._closed or self._quiet() or self._explain_due()):
                    continue  # a moment between records: in a storm, others are on their way
                self._busy = True
                if copy:  # cheap, and what the next batch's readers list: before records and misses
                    copies, self._copies = self._copies, {}
                else:
                    copies = {}
                    # Misses that have waited long share the writer with waiting records, time for time.
                    due = self._explain_due() and time.monotonic() >= records_until
                    if self._items and not due and self._arriving and len(self._items) < MAX_BATCH_RECORDS:
                        self._cond.wait_for(lambda: not self._arriving or len(self._items) >= MAX_BATCH_RECORDS,
                                            LINGER_S)
                    elif self._items and not due and self._storm and len(self._items) < STORM_BATCH:
                        self._cond.wait_for(lambda: len(self._items) >= STORM_BATCH or self._closed,
                                            STORM_LINGER_S)
                    batch = self._take() if self._items and not due else None
            if copies:
                self._copy_all(copies)
                continue
            if batch is None:
                began = time.monotonic()
                self._explain_some()
                records_until = 2 * time.monotonic() - began
                continue
            started = time.monotonic()
            # A lone record: its copies are made and its misses explained before its answer, so that a reader right
            # after sees them. One that comes alone in a storm (after a batch of several, with no quiet moment since)
            # waits for the quiet moment as the others do: a writer that keeps up with a storm takes its records one
            # at a time, and their copies onto 200 entry rows each cost PostgreSQL half a second before the answer.
            if len(batch) > 1:
                self._storm = True
            elif started - self._answered_at >= QUIET_S:
                self._storm = False
            lone = len(batch) == 1 and not self._storm
            outcomes = self._outcomes(batch, lone)
            if lone:
                self._explain_own(batch[0])
            for item, outcome in zip(batch, outcomes, strict=True):
                try:
                    item.loop.call_soon_threadsafe(_settle, item.future, outcome)
                except RuntimeError:  # its loop has closed: nobody waits for it any more
                    pass
            with self._cond:
                self._last_activity = self._answered_at = time.monotonic()
            per_record = (time.monotonic() - started) / len(batch)
            self._seconds_per_record = 0.8 * self._seconds_per_record + 0.2 * per_record

    def _quiet(self) -> bool:
        """No record queued or answered for QUIET_S (called locked): a moment to explain misses in. Answered too: a
        batch that waited for another worker's transaction ends long after its records arrived, and its clients'
        next records are on their way."""
        return not self._arriving and time.monotonic() - self._last_activity >= QUIET_S

    def _until_quiet(self) -> float:
        if self._arriving:
            return QUIET_S  # an arrival's end wakes the writer
        return max(QUIET_S - (time.monotonic() - self._last_activity), 0.001)

    def _copies_of(self, cache: str) -> set[str]:
        """The keys of ``cache`` whose copies wait (called locked); the wait starts with the first cache's."""
        if not self._copies:
            self._copies_since = time.monotonic()
        return self._copies.setdefault(cache, set())

    def _copies_due(self) -> bool:
        return time.monotonic() - self._copies_since >= COPY_DEFER_S

    def _copy_all(self, copies: dict[str, set[str]]) -> None:
        for cache, keys in copies.items():
            if not keys:
                continue  # its batches' keys were all recomputed, their copies made with them
            try:
                self._copy(cache, keys)
            except Exception as exc:  # noqa: BLE001 - tried again after a pause; the writer goes on
                with self._cond:
                    closing = self._closed
                    if not closing:
                        self._copies_of(cache).update(keys)
                log.warning("copying the aggregates of %d keys of %s onto their entry rows failed (%s): %s", len(keys),
                            cache, "the service is stopping: their listed hits stay behind until their keys are "
                            "reported again" if closing else f"trying again in {COPY_RETRY_S:g} s", exc)
                if not closing:
                    time.sleep(COPY_RETRY_S)  # the catalog is failing: the next batch would as well

    def _explain_due(self) -> bool:
        if not self._later:
            return False
        return (time.monotonic() - min(self._later_since.values()) >= DEFER_S
                or sum(len(p) for p in self._later.values()) >= MAX_DEFERRED)

    def _explain_some(self) -> None:
        """One transaction's worth of the misses that have waited longest."""
        cache = min(self._later_since, key=self._later_since.__getitem__)
        self._explain_held(cache, self._later[cache].take(EXPLAIN_CHUNK))

    def _explain_own(self, item: _Item) -> None:
        """The misses of ``item``'s record alone (not the others': in a storm, those wait for a quiet moment)."""
        held = self._later.get(item.cache)
        if held is not None:
            self._explain_held(item.cache, held.take_record(item.record))

    def _explain_held(self, cache: str, todo: list[Pending]) -> None:
        if not len(self._later[cache]):
            del self._later[cache], self._later_since[cache]
        if not todo:
            return
        try:
            self._explain(cache, todo)
        except Exception as exc:  # noqa: BLE001 - the rows stay unexplained (shown so); the writer goes on
            log.warning("explaining %d misses of %s failed (they stay unexplained until their records are "
                        "ingested again): %s", len(todo), cache, exc)

    def _outcomes(self, batch: list[_Item], lone: bool) -> list[IngestResult | BaseException]:
        cache, records = batch[0].cache, [i.record for i in batch]
        later = self._later.setdefault(cache, PendingMisses())
        self._later_since.setdefault(cache, time.monotonic())
        copies = None
        if not lone:  # a lone record's copies go in its own transaction: a reader right after sees them
            with self._cond:
                copies = self._copies_of(cache)
        try:
            return list(self._batch(cache, records, later, copies))
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
