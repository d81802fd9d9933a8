"""The background loops of a service process: the drain of the report inbox (woken by each POST to this process,
again at once after a round that folded something, and every DRAIN_POLL_S for records POSTed to others), rescans
of every cache each period, and throttled integrity passes, which start after the first round of rescans.

Every process with loops runs them, and each pass first claims its loop's lock in the catalog: one process runs a
given pass at a time, and the others skip that round. A failed round is noted in
:class:`~jaxcache.service.health.LoopHealth` and tried again after a backoff; a pass that never returns reads
``stuck`` past its bound, and stopping waits for it at most ``shutdown_wait_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TypeVar

from jaxcache.service.health import stuck_after
from jaxcache.service.integrity import verification as verifying
from jaxcache.service.reports.draining import drain_all
from jaxcache.service.rescan import scan as rescans
from jaxcache.service.state import State

log = logging.getLogger("jaxcache.service")

RESCAN, VERIFY, DRAIN = "rescan", "verify", "drain"
#: How often the drain looks at the inbox when no POST to this process woke it: records POSTed to the other workers
#: or replicas wait at most this long (plus the drain itself) before the catalog shows them.
DRAIN_POLL_S = 1.0

Round = Callable[[], list[tuple[str, Exception]]]
T = TypeVar("T")


async def in_thread(state: State, loop: str, period_s: float, one_pass: Callable[[], T],
                    failures: Callable[[T], list[tuple[str, Exception]]] = lambda _: []) -> T | None:
    """``one_pass`` in a daemon thread of its own, noted as running in ``state.loops``, if this process claims the
    loop's lock (``loop:NAME``, in every process and replica on the catalog); None when another holds it, which
    runs the pass instead: several processes never run the same pass at once. Its outcome (an error, the
    ``failures`` it returned, or success) is noted in that thread too: noting publishes to the catalog, which may
    wait on a lock, and the event loop must not. A daemon thread, not anyio's pool: the interpreter's exit joins
    those, so one blocked for good in a pass never ended the process (Ctrl-C, SIGTERM to a container's PID 1).
    Cancelled, this returns at once and leaves the thread to finish, or to end with the process."""
    running = asyncio.get_running_loop()
    done: asyncio.Future[T] = running.create_future()
    bound = stuck_after(period_s, state.settings.stuck_after_s)

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def body() -> None:
        result: T | None = None
        error: BaseException | None = None
        lock = state.catalog.locks.get(f"loop:{loop}")
        try:
            if lock.acquire(blocking=False):
                try:
                    with state.loops.passing(loop, bound):
                        result = one_pass()
                finally:
                    lock.release()
                noted = failures(result)
                for where, failure in noted:
                    state.loops.failed(loop, failure, where)
                if not noted:
                    state.loops.succeeded(loop)
        except Exception as exc:  # noqa: BLE001 - noted, logged once, retried: the loop must outlive it
            state.loops.failed(loop, exc)
            error = exc
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            error = exc
        with contextlib.suppress(RuntimeError):  # the event loop closed while the pass ran: nobody waits
            running.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=body, name=f"jaxcache-{loop}", daemon=True).start()
    return await done


@contextlib.asynccontextmanager
async def background(state: State) -> AsyncIterator[None]:
    """Run the loops while the app serves; stop them when it stops."""
    period_s = state.settings.rescan_s
    state.metrics.start_loops((DRAIN, RESCAN, VERIFY))
    stop = asyncio.Event()
    first_round = asyncio.Event()
    stop_verify = threading.Event()  # seen by a pass running in a worker thread

    async def supervised(loop: str, one_round: Round, after_round: Callable[[], None] | None = None) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # noted in the pass's thread; tried again after the backoff
                await in_thread(state, loop, period_s, one_round, failures=lambda failed: failed)
            if after_round is not None:
                after_round()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=state.loops.wait_s(loop, period_s))

    def rescanned() -> None:
        state.background_rounds += 1
        first_round.set()

    async def verification() -> None:
        # Separate from rescans: a slow, throttled pass must not delay them.
        await first_round.wait()
        await supervised(VERIFY, lambda: verifying.verify_all(state, stop_verify))

    arrived = state.inbox_arrived = asyncio.Event()

    async def draining() -> None:
        while not stop.is_set():
            arrived.clear()  # before the pass: a record accepted during it wakes the next one at once
            folded: int | None = 0
            with contextlib.suppress(Exception):  # noted in the pass's thread; tried again after the backoff
                folded = await in_thread(state, DRAIN, DRAIN_POLL_S, partial(drain_all, state))
            if folded:
                # Records arrive while a round folds, POSTed to other processes too (--role api), which cannot
                # wake this one: look again at once, and wait only once a round found nothing.
                continue
            # While its passes fail, POSTs do not hurry the backoff; while another process drains (it looks again
            # at once after each round that folded something), they do not make this one claim the lock each time.
            wake = stop if folded is None or state.loops.status(DRAIN).failures else arrived
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=state.loops.wait_s(DRAIN, DRAIN_POLL_S))

    tasks = [asyncio.create_task(draining()),
             asyncio.create_task(supervised(RESCAN, partial(rescans.rescan_all, state), rescanned)),
             asyncio.create_task(verification())]
    try:
        yield
    finally:
        stop.set()
        arrived.set()
        stop_verify.set()
        first_round.set()  # a verification still waiting for it sees stop and ends
        state.inbox_arrived = None
        # Passes end at their next step (a verification at its next batch); one blocked for good is left behind
        # after a bounded wait, so that SIGTERM stops the service.
        _, pending = await asyncio.wait(tasks, timeout=state.settings.shutdown_wait_s)
        if pending:
            log.warning("stopping without waiting longer for %s (JAXCACHE_SHUTDOWN_WAIT_S=%g)",
                        "; ".join(state.loops.running()) or "a background pass", state.settings.shutdown_wait_s)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
