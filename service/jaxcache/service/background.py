"""The background loops, a daemon thread each: the inbox's drain, rescans, throttled integrity passes. Each round
claims its loop's lock (``loop:NAME``) or is skipped; how each is doing feeds ``/readyz`` and the metrics.
docs/service.md, "Serving"."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from typing import Any, Literal, TypeVar

import anyio.to_thread
from sqlalchemy.exc import DBAPIError, OperationalError

from jaxcache.errors import JaxcacheError
from jaxcache.service.catalog.coordination import InboxListener, LoopStatuses
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.metrics import Metrics
from jaxcache.service.settings import ServiceSettings

log = logging.getLogger("jaxcache.service")

RESCAN, VERIFY, DRAIN = "rescan", "verify", "drain"
#: How often the drain looks at the inbox on SQLite when no POST to this process woke it.
DRAIN_POLL_S = 1.0

#: The first retry after an error; each further failure doubles it (:func:`backoff_s`).
BACKOFF_FIRST_S = 1.0
#: The longest wait before the drain listens again after its connection was lost.
RELISTEN_MAX_S = 60.0
#: A pass is stuck past this many of its loop's periods, never sooner than STUCK_MIN_S (a large bucket's rescan).
STUCK_PERIODS, STUCK_MIN_S = 3, 600.0
PROGRESS_PUBLISH_S = 5.0  # how often a pass's steps are published: far below any stuck bound

Health = Literal["ok", "failing", "stuck"]
T = TypeVar("T")
#: What went wrong in a round: each cache whose part failed (or "": the whole round), with why.
Failures = list[tuple[str, Exception]]
#: A pass over every cache.
Failing = Callable[[], Failures]
_IDLE: dict[str, Any] = {"running_cache": None, "cache_since_s": None, "progress_s": None}  # no pass on a cache


def backoff_s(failures: int, most_s: float) -> float:
    """The wait before trying again after ``failures`` failures in a row: 1 s, doubling, at most ``most_s``."""
    return min(most_s, BACKOFF_FIRST_S * 2 ** min(failures - 1, 30))


class Outage:
    """Failures in a row, so that each kind is logged once until a success ends them, not at every retry."""

    def __init__(self) -> None:
        self.failures = 0
        self._kinds: set[str] = set()
        self._lock = threading.Lock()

    def failed(self, kind: str = "") -> bool:
        """Count a failure; whether it is the first of its ``kind`` since the last success (the one to log)."""
        with self._lock:
            self.failures += 1
            first = kind not in self._kinds
            self._kinds.add(kind)
        return first

    def succeeded(self) -> int:
        """End the outage; how many failures it had (0: there was none, nothing to say)."""
        with self._lock:
            failures, self.failures = self.failures, 0
            self._kinds.clear()
        return failures


@dataclass(frozen=True, slots=True)
class LoopStatus:
    """One loop as ``/readyz`` shows it: stuck past ``stuck_after_s`` since its pass (or cache) or last step."""

    last_success_s: float | None = None
    last_error: str | None = None
    last_error_s: float | None = None
    failures: int = 0
    running_since_s: float | None = None
    running_cache: str | None = None
    cache_since_s: float | None = None
    stuck_after_s: float | None = None
    progress_s: float | None = None
    failed_caches: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoopStatus:
        """From :func:`dataclasses.asdict` gone through JSON; fields this version does not know are dropped."""
        values = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
        values["failed_caches"] = tuple(values.get("failed_caches") or ())
        return cls(**values)

    def health(self, now: float) -> Health:
        """``stuck`` while a pass has run past its bound, else ``failing`` while rounds fail, else ``ok``."""
        return "stuck" if self._stuck(self.running_since_s, now) else "failing" if self.failures else "ok"

    def cache_health(self, caches: Iterable[str], now: float) -> dict[str, Health]:
        """Each of ``caches`` (and any other this loop is stuck or failing on): ``stuck``, ``failing`` or ``ok``."""
        found: dict[str, Health] = dict.fromkeys(caches, "ok")
        found.update(dict.fromkeys(self.failed_caches, "failing"))
        if self.running_cache is not None and self._stuck(self.cache_since_s, now):
            found[self.running_cache] = "stuck"
        return found

    def _stuck(self, since: float | None, now: float) -> bool:
        if since is not None and self.progress_s is not None:
            since = max(since, self.progress_s)
        return since is not None and self.stuck_after_s is not None and now - since > self.stuck_after_s


#: What says how a loop's last round ended (as opposed to the pass running now).
_OUTCOME = ("last_success_s", "last_error", "last_error_s", "failures", "failed_caches")


def _ended_s(status: LoopStatus) -> float:
    """When the round whose outcome ``status`` shows ended."""
    return max(status.last_success_s or 0.0, status.last_error_s or 0.0)


def stuck_after(period_s: float, setting: float | None) -> float:
    """How long a pass of a loop run every ``period_s`` may take before it is stuck (``JAXCACHE_STUCK_AFTER_S``)."""
    return setting if setting is not None else max(STUCK_PERIODS * period_s, STUCK_MIN_S)


class Loops:
    """This process's loops: their rounds and how each is doing, shared by their threads and the routes."""

    def __init__(self, metrics: Metrics, catalog: Catalog, settings: ServiceSettings) -> None:
        self.metrics, self.catalog, self.settings = metrics, catalog, settings
        self._statuses = LoopStatuses(catalog.engine)  # where each change is published for every process
        self._lock = threading.Lock()
        self._loops: dict[str, LoopStatus] = {}
        self._outages: defaultdict[str, Outage] = defaultdict(Outage)  # each loop's failed rounds since a success
        self._publishing = Outage()
        self._thread = threading.local()  # .loop: the loop whose pass the calling thread runs
        self._published: dict[str, float] = {}  # loop -> when its progress was last published
        self.arrived: threading.Event | None = None  # the drain's wake-up, while this process runs one
        self.rescan_rounds = 0  # background rescan rounds finished (or failed) since start

    def wake_drain(self) -> None:
        """A record entered the inbox: this process's drain (if it runs one) takes it now."""
        if self.arrived is not None:
            self.arrived.set()

    def one_round(self, loop: str, period_s: float, one_pass: Callable[[], T],
                  failures: Callable[[T], Failures] = lambda _: []) -> T | None:
        """``one_pass()`` if this process claims the loop's lock, else None; shown running (or stuck) until it
        returns, with the outcome of the loop's last round (any process's), and how it ended noted before the lock
        is released."""
        lock = self.catalog.locks.get(f"loop:{loop}")
        try:
            if not lock.acquire(blocking=False):
                return None
        except Exception as exc:
            self._ended(loop, [("", exc)])
            raise
        try:
            self._thread.loop = loop
            # The last round may have been another process's: its outcome stays shown while this pass runs (a pass
            # published as this process last saw the loop said "ok" while every other process's rounds failed).
            self._adopt(loop)
            self._step(loop, at_once=True, running_since_s=time.time(), **_IDLE,
                       stuck_after_s=stuck_after(period_s, self.settings.stuck_after_s))
            try:
                result = one_pass()
            except Exception as exc:
                self._ended(loop, [("", exc)])
                raise
            # Noted before the lock is released, so that the next process to claim it adopts this outcome.
            self._ended(loop, failures(result))
            return result
        finally:
            self._thread.loop = None
            lock.release()

    def _adopt(self, loop: str) -> None:
        """Take the loop's last outcome (successes, errors, failed rounds in a row, failing caches) from what was
        published, where another process's round ended after this process's last one."""
        try:
            published = self._statuses.read().get(loop)
        except Exception:  # noqa: BLE001 - the catalog is away: this process's own view, and this round says more
            return
        if not published:
            return
        theirs = LoopStatus.from_dict(published)
        with self._lock:
            mine = self._loops.get(loop, LoopStatus())
            if _ended_s(theirs) > _ended_s(mine):
                self._loops[loop] = replace(mine, **{name: getattr(theirs, name) for name in _OUTCOME})

    def _ended(self, loop: str, failed: Failures) -> None:
        """Note a round that ended: a success, or each failure (one cache's part, ``where``, or the round's), the
        first of each kind logged."""
        now, outage = time.time(), self._outages[loop]
        said = [f"{where}: {describe(exc)}" if where else describe(exc) for where, exc in failed]
        firsts = [outage.failed(f"{where}:{type(exc).__name__}") for where, exc in failed]
        if failed:  # rounds failed in a row, whichever process ran them (each adopts the last outcome: _adopt)
            with self._lock:
                before_failures = self._loops.get(loop, LoopStatus()).failures
            outcome = {"last_error": said[-1][:2000], "last_error_s": now, "failures": before_failures + 1,
                       "failed_caches": tuple(sorted({where for where, _ in failed if where}))}
        else:
            outcome = {"last_success_s": now, "failures": 0, "failed_caches": ()}
        before = self._step(loop, at_once=True, running_since_s=None, **_IDLE, **outcome)
        if not failed and (failures := outage.succeeded()):
            log.info("background %s recovered after %d failed round(s); last error: %s", loop, failures,
                     before.last_error)
        for (_, exc), message, first in zip(failed, said, firsts, strict=True):
            self.metrics.loop_errors.labels(loop, type(exc).__name__).inc()
            if first:
                # Our own errors and a database that is down say what to do; else a bug, whose traceback helps.
                log.error("background %s failed: %s (retrying with backoff; this is logged once until it recovers)",
                          loop, message, exc_info=None if isinstance(exc, JaxcacheError | OperationalError) else exc)
            else:
                log.debug("background %s failed again: %s", loop, message)

    def on_cache(self, cache: str) -> None:
        """The pass this thread runs (if it runs one) moves on to ``cache``."""
        self._step(getattr(self._thread, "loop", None), at_once=True, running_cache=cache, cache_since_s=time.time())

    def progress(self) -> None:
        """The pass this thread runs (if any) took a step: not stuck while steps come."""
        self._step(getattr(self._thread, "loop", None), at_once=False, progress_s=time.time())

    def _step(self, loop: str | None, at_once: bool, **changes: Any) -> LoopStatus:
        """Change how ``loop`` is doing (the status before); published at once, or every PROGRESS_PUBLISH_S while a
        pass's steps come."""
        if loop is None:  # a request's rescan or verification, not a loop's
            return LoopStatus()
        now = time.time()
        with self._lock:
            before = self._loops.get(loop, LoopStatus())
            self._loops[loop] = status = replace(before, **changes)
        if at_once or before.progress_s is None or now - self._published.get(loop, 0.0) >= PROGRESS_PUBLISH_S:
            self._published[loop] = now
            try:
                self._statuses.publish(loop, asdict(status))
            except Exception as exc:  # noqa: BLE001 - other processes show an older status meanwhile
                if self._publishing.failed():
                    log.warning("could not publish the %s loop's status: %s (other processes' /readyz shows an "
                                "older one until it can)", loop, describe(exc))
            else:
                self._publishing.succeeded()
        return before

    def running(self) -> list[str]:
        """The passes running now, for a log line."""
        now = time.time()
        return [f"the {loop} pass{'' if s.running_cache is None else f' on cache {s.running_cache!r}'}, running for "
                f"{now - s.running_since_s:.0f} s" for loop, s in sorted(self.snapshot().items())
                if s.running_since_s is not None]

    def wait_s(self, loop: str, period_s: float) -> float:
        """Seconds until the loop's next round: its period, or a doubling backoff while rounds fail."""
        failures = self._outages[loop].failures
        return backoff_s(failures, period_s) if failures else period_s

    def snapshot(self) -> dict[str, LoopStatus]:
        with self._lock:
            return dict(self._loops)

    def shared(self) -> dict[str, LoopStatus]:
        """How the loops are doing, whichever process runs them (this one's view if unreadable)."""
        try:
            published = self._statuses.read()
        except Exception:  # noqa: BLE001 - the catalog is away: /readyz says so, and shows what this process knows
            return self.snapshot()
        return {**self.snapshot(), **{loop: LoopStatus.from_dict(status) for loop, status in published.items()}}


def export_health(metrics: Metrics, snapshot: dict[str, LoopStatus], now: float) -> None:
    """Set the loops' gauges from ``snapshot`` at each scrape (a stuck pass tells nobody; ``--role api`` runs none)."""
    for loop, status in snapshot.items():
        metrics.loop_stuck.labels(loop).set(1 if status.health(now) == "stuck" else 0)
        metrics.loop_failing.labels(loop).set(1 if status.failures else 0)
        if status.last_success_s is not None:
            metrics.loop_last_success.labels(loop).set(status.last_success_s)


def describe(exc: BaseException) -> str:
    """One line on an error: for the database's, what the server said (not the statement and its parameters)."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        said = str(exc.orig).strip().splitlines()
        return f"catalog database: {said[0] if said else type(exc.orig).__name__}"
    text = str(exc).strip()
    return text.splitlines()[0][:1000] if text else type(exc).__name__


@contextlib.asynccontextmanager
async def background(loops: Loops, *, drain: Callable[[], int], rescan: Failing,
                     verify: Callable[[threading.Event], Failures]) -> AsyncIterator[None]:
    """Run the loops' passes (``verify`` is handed the stop event) while the app serves; stop them when it stops."""
    catalog, settings = loops.catalog, loops.settings
    period_s = settings.rescan_s
    loops.metrics.start_loops((DRAIN, RESCAN, VERIFY))
    stop, first_round = threading.Event(), threading.Event()
    arrived = loops.arrived = threading.Event()

    def every_period(loop: str, one_pass: Failing, after_round: Callable[[], None] = lambda: None) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # noted; tried again after the backoff
                loops.one_round(loop, period_s, one_pass, failures=lambda failed: failed)
            after_round()
            stop.wait(loops.wait_s(loop, period_s))

    def rescanned() -> None:
        loops.rescan_rounds += 1
        first_round.set()

    def verifying() -> None:  # apart from rescans: a slow, throttled pass must not delay them
        first_round.wait()
        every_period(VERIFY, partial(verify, stop))

    def draining() -> None:
        listener = InboxListener(catalog.engine.url) if catalog.dialect == "postgresql" else None
        lost = Outage()  # of the connection listening for reports
        try:
            while not stop.is_set():
                arrived.clear()  # before the pass: a record accepted during it wakes the next one at once
                try:
                    folded = loops.one_round(DRAIN, DRAIN_POLL_S, drain)
                except Exception:  # noqa: BLE001 - noted; tried again after the backoff
                    folded = None
                if folded:  # records arrive while a round folds: look again at once
                    continue
                if folded is None:  # failed (records hurry no backoff), or another process drains
                    stop.wait(loops.wait_s(DRAIN, DRAIN_POLL_S))
                elif listener is None:  # SQLite: only a POST to this process wakes it; others' records are polled
                    arrived.wait(DRAIN_POLL_S)
                else:
                    _listen(listener, stop, lost)
        finally:
            if listener is not None:
                listener.close()

    threads = [threading.Thread(target=work, name=f"jaxcache-{loop}", daemon=True) for loop, work in (
        (DRAIN, draining), (RESCAN, partial(every_period, RESCAN, rescan, rescanned)),
        (VERIFY, verifying))]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        arrived.set()
        first_round.set()  # a verification still waiting for it sees stop and ends
        loops.arrived = None
        # Passes end at their next step; one blocked for good is left behind, so that SIGTERM stops the service.
        if not await anyio.to_thread.run_sync(_join, threads, settings.shutdown_wait_s):
            log.warning("stopping without waiting longer for %s (JAXCACHE_SHUTDOWN_WAIT_S=%g)",
                        "; ".join(loops.running()) or "a background pass", settings.shutdown_wait_s)


def _listen(listener: InboxListener, stop: threading.Event, lost: Outage) -> None:
    """Wait for a NOTIFY, looking at ``stop`` each second, or back off after a lost connection."""
    try:
        while not stop.is_set() and not listener.wait(1.0):
            pass
    except Exception as exc:  # noqa: BLE001 - the database is away: the drain's own pass says so in its health
        if lost.failed():
            log.warning("the drain's connection listening for reports was lost (%s): connecting again; meanwhile "
                        "reports wait in the inbox", describe(exc)[:300])
        stop.wait(backoff_s(lost.failures, RELISTEN_MAX_S))
    else:
        lost.succeeded()


def _join(threads: list[threading.Thread], wait_s: float) -> bool:
    """Whether every thread ended within ``wait_s`` in all."""
    deadline = time.monotonic() + wait_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)
