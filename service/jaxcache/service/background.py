"""The background loops, a daemon thread each: the inbox's drain, rescans, throttled integrity passes. Each round
claims its loop's lock (``loop:NAME``) or is skipped; docs/service.md, "Serving"."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TypeVar

import anyio.to_thread

from jaxcache.service.catalog.coordination import InboxListener
from jaxcache.service.health import BACKOFF_FIRST_S, describe, stuck_after
from jaxcache.service.integrity import verification
from jaxcache.service.reports.queue import drain_all
from jaxcache.service.rescan import scan
from jaxcache.service.state import State

log = logging.getLogger("jaxcache.service")

RESCAN, VERIFY, DRAIN = "rescan", "verify", "drain"
#: How often the drain looks at the inbox on SQLite when no POST to this process woke it.
DRAIN_POLL_S = 1.0

T = TypeVar("T")


def one_round(state: State, loop: str, period_s: float, one_pass: Callable[[], T],
              failures: Callable[[T], list[tuple[str, Exception]]] = lambda _: []) -> T | None:
    """``one_pass()`` if this process claims the loop's lock, else None; noted once the lock is released."""
    lock = state.catalog.locks.get(f"loop:{loop}")
    try:
        if not lock.acquire(blocking=False):
            return None
        try:
            with state.loops.passing(loop, stuck_after(period_s, state.settings.stuck_after_s)):
                result = one_pass()
        finally:
            lock.release()
    except Exception as exc:
        state.loops.failed(loop, exc)
        raise
    for where, failure in (noted := failures(result)):
        state.loops.failed(loop, failure, where)
    if not noted:
        state.loops.succeeded(loop)
    return result


@contextlib.asynccontextmanager
async def background(state: State) -> AsyncIterator[None]:
    """Run the loops while the app serves; stop them when it stops."""
    period_s = state.settings.rescan_s
    state.metrics.start_loops((DRAIN, RESCAN, VERIFY))
    stop, first_round = threading.Event(), threading.Event()
    arrived = state.inbox_arrived = threading.Event()

    def every_period(loop: str, one_pass: Callable[[], list[tuple[str, Exception]]],
                     after_round: Callable[[], None] = lambda: None) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # noted; tried again after the backoff
                one_round(state, loop, period_s, one_pass, failures=lambda failed: failed)
            after_round()
            stop.wait(state.loops.wait_s(loop, period_s))

    def rescanned() -> None:
        state.background_rounds += 1
        first_round.set()

    def verifying() -> None:  # apart from rescans: a slow, throttled pass must not delay them
        first_round.wait()
        every_period(VERIFY, lambda: verification.verify_all(state, stop))

    def draining() -> None:
        listener = InboxListener(state.catalog.engine.url) if state.catalog.dialect == "postgresql" else None
        lost = 0  # connections to listen on lost in a row
        try:
            while not stop.is_set():
                arrived.clear()  # before the pass: a record accepted during it wakes the next one at once
                try:
                    folded = one_round(state, DRAIN, DRAIN_POLL_S, partial(drain_all, state))
                except Exception:  # noqa: BLE001 - noted; tried again after the backoff
                    folded = None
                if folded:  # records arrive while a round folds: look again at once
                    continue
                if folded is None or state.loops.status(DRAIN).failures:  # records hurry no backoff
                    stop.wait(state.loops.wait_s(DRAIN, DRAIN_POLL_S))
                elif listener is None:  # SQLite: only a POST to this process wakes it; others' records are polled
                    arrived.wait(DRAIN_POLL_S)
                else:
                    lost = _listen(listener, stop, lost)
        finally:
            if listener is not None:
                listener.close()

    threads = [threading.Thread(target=work, name=f"jaxcache-{loop}", daemon=True) for loop, work in (
        (DRAIN, draining), (RESCAN, partial(every_period, RESCAN, partial(scan.rescan_all, state), rescanned)),
        (VERIFY, verifying))]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        arrived.set()
        first_round.set()  # a verification still waiting for it sees stop and ends
        state.inbox_arrived = None
        # Passes end at their next step; one blocked for good is left behind, so that SIGTERM stops the service.
        if not await anyio.to_thread.run_sync(_join, threads, state.settings.shutdown_wait_s):
            log.warning("stopping without waiting longer for %s (JAXCACHE_SHUTDOWN_WAIT_S=%g)",
                        "; ".join(state.loops.running()) or "a background pass", state.settings.shutdown_wait_s)


def _listen(listener: InboxListener, stop: threading.Event, lost: int) -> int:
    """Wait for a NOTIFY, looking at ``stop`` each second, or back off after a lost connection; the new ``lost``."""
    try:
        while not stop.is_set() and not listener.wait(1.0):
            pass
    except Exception as exc:  # noqa: BLE001 - the database is away: the drain's own pass says so in its health
        lost += 1
        if lost == 1:  # once per outage, not at each try
            log.warning("the drain's connection listening for reports was lost (%s): connecting again; meanwhile "
                        "reports wait in the inbox", describe(exc)[:300])
        stop.wait(min(60.0, BACKOFF_FIRST_S * 2 ** min(lost - 1, 6)))
        return lost
    return 0


def _join(threads: list[threading.Thread], wait_s: float) -> bool:
    """Whether every thread ended within ``wait_s`` in all."""
    deadline = time.monotonic() + wait_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)
