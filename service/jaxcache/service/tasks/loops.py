"""The background loops of one service process: rescans of every cache each period, and throttled integrity
passes, which start after the first round of rescans (started beside it, they queued a second rescan of each cache
behind the first)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator

from fastapi.concurrency import run_in_threadpool

from jaxcache.service.state import State

log = logging.getLogger("jaxcache.service")


@contextlib.asynccontextmanager
async def background(state: State) -> AsyncIterator[None]:
    """Run the loops while the app serves; stop them when it stops."""
    period_s = state.settings.rescan_s
    stop = asyncio.Event()
    first_round = asyncio.Event()
    stop_verify = threading.Event()  # seen by a pass running in a worker thread

    async def rescans() -> None:
        while not stop.is_set():
            try:
                await run_in_threadpool(state.rescan_all)
            except Exception:  # the catalog is unreachable (a database fail-over): try again next round
                log.exception("background rescans failed")
            state.background_rounds += 1
            first_round.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=period_s)

    async def verification() -> None:
        # Separate from rescans: a slow, throttled pass must not delay them.
        await first_round.wait()
        while not stop.is_set():
            await run_in_threadpool(state.verify_all, stop_verify)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=period_s)

    tasks = [asyncio.create_task(rescans()), asyncio.create_task(verification())]
    try:
        yield
    finally:
        stop.set()
        stop_verify.set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
