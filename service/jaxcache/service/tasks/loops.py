"""The background loops of one service process: the drain of the report inbox (woken by each POST to this process,
and every DRAIN_POLL_S for records POSTed to others), rescans of every cache each period, and throttled integrity
passes, which start after the first round of rescans (started beside it, they queued a second rescan of each cache
behind the first).

A loop never dies of an error: a failed round (the catalog in a fail-over, a root unmounted, a bug) is noted in
:class:`~jaxcache.service.tasks.health.LoopHealth` and the round is tried again after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable

from fastapi.concurrency import run_in_threadpool

from jaxcache.service.state import State

RESCAN, VERIFY, DRAIN = "rescan", "verify", "drain"
#: How often the drain looks at the inbox when no POST to this process woke it: records POSTed to the other workers
#: or replicas wait at most this long (plus the drain itself) before the catalog shows them.
DRAIN_POLL_S = 1.0

Round = Callable[[], list[tuple[str, Exception]]]


@contextlib.asynccontextmanager
async def background(state: State) -> AsyncIterator[None]:
    """Run the loops while the app serves; stop them when it stops."""
    period_s = state.settings.rescan_s
    stop = asyncio.Event()
    first_round = asyncio.Event()
    stop_verify = threading.Event()  # seen by a pass running in a worker thread

    async def supervised(loop: str, one_round: Round, after_round: Callable[[], None] | None = None) -> None:
        while not stop.is_set():
            try:
                failed = await run_in_threadpool(one_round)
            except Exception as exc:  # noqa: BLE001 - noted, logged once, retried: the loop must outlive it
                state.loops.failed(loop, exc)
            else:
                for where, error in failed:
                    state.loops.failed(loop, error, where)
                if not failed:
                    state.loops.succeeded(loop)
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
        await supervised(VERIFY, lambda: state.verify_all(stop_verify))

    arrived = state.inbox_arrived = asyncio.Event()

    async def draining() -> None:
        while not stop.is_set():
            arrived.clear()  # before the pass: a record accepted during it wakes the next one at once
            try:
                await run_in_threadpool(state.drain_all)
            except Exception as exc:  # noqa: BLE001 - noted, logged once, retried: the loop must outlive it
                state.loops.failed(DRAIN, exc)
            else:
                state.loops.succeeded(DRAIN)
            # While its passes fail, POSTs do not hurry the backoff.
            wake = stop if state.loops.status(DRAIN).failures else arrived
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=state.loops.wait_s(DRAIN, DRAIN_POLL_S))

    tasks = [asyncio.create_task(draining()),
             asyncio.create_task(supervised(RESCAN, state.rescan_all, rescanned)),
             asyncio.create_task(verification())]
    try:
        yield
    finally:
        stop.set()
        arrived.set()
        stop_verify.set()
        state.inbox_arrived = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
