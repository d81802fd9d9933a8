"""The report writer process of ``jaxcache serve --workers``: one per service, it owns the report queue (batches,
explanations, copies onto entry rows) that each process used to run for itself, and answers the workers over a
unix socket in the runtime directory. Started and restarted by the serving process like a worker; on SIGTERM it
stops taking records, ingests what it holds and exits. docs/service.md, "Serving"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.service.ingestion import wire
from jaxcache.service.ingestion.queue import QueueFullError, ReportQueue

log = logging.getLogger("jaxcache.service")


def run_writer() -> None:
    """The process's body (spawned by the serving process, with the workers' environment)."""
    from uvicorn.config import STARTUP_FAILURE

    from jaxcache.service import supervisor, workers
    from jaxcache.service.settings import ServiceSettings
    from jaxcache.service.state import State
    from jaxcache.service.tasks import memory

    workers.die_with_parent(int(os.environ[supervisor.SUPERVISOR_ENV]))
    runtime = workers.Runtime(os.environ[supervisor.RUNTIME_ENV])
    settings = ServiceSettings()
    try:
        state = State(settings, runtime.generations(settings), migrate=False)  # the serving process migrated
    except JaxcacheError as exc:  # checked by the serving process first: something changed since
        print(f"jaxcache: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None
    reports = state.reports
    assert isinstance(reports, ReportQueue)  # a worker's app swaps in RemoteReports; this process builds no app
    reports.max_queued = settings.report_queue * settings.workers  # as when each worker had its own queue
    memory.settle_startup()
    try:
        asyncio.run(serve(reports, runtime.dir / wire.SOCKET_NAME))
    finally:
        state.catalog.dispose()


async def serve(reports: ReportQueue, path: Path, stop: asyncio.Event | None = None) -> None:
    """Answer workers on ``path`` until SIGTERM or SIGINT (or ``stop``), then ingest what was taken."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, RuntimeError):  # not the main thread (tests): ``stop`` only
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a writer before this one died without removing it
    server = await asyncio.start_unix_server(lambda r, w: _connection(reports, r, w), path=str(path))
    (path.parent / wire.PID_NAME).write_text(str(os.getpid()))
    log.info("process %d ingests the workers' run records", os.getpid())
    async with server:
        await stop.wait()
    await asyncio.to_thread(reports.close)


async def _connection(reports: ReportQueue, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    tasks: set[asyncio.Task] = set()
    texts = wire.Texts()  # the connection's: numbered in the order read
    try:
        while (request := await wire.read_request(reader)) is not None:
            if isinstance(request, wire.Ingest):
                record = request.record
                record.parts, record.programs = texts.unpack(record.parts), texts.unpack(record.programs)
            task = asyncio.create_task(_answer(reports, request, writer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    except (ConnectionError, OSError, ValueError) as exc:
        log.warning("a worker's connection to the report writer broke: %s", exc)
    finally:
        if tasks:  # what the worker sent is ingested even if it is no longer there to hear
            await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()


async def _answer(reports: ReportQueue, request: wire.Request, writer: asyncio.StreamWriter) -> None:
    reply = await _reply(reports, request)
    if writer.is_closing():
        return
    writer.write(wire.frame(reply))
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _reply(reports: ReportQueue, request: wire.Request) -> wire.Reply:
    if isinstance(request, wire.Settle):
        return wire.Reply(request.id, settled=await asyncio.to_thread(reports.settled, request.timeout_s))
    try:
        r = await reports.ingest(request.cache, request.record)
    except InvalidInputError as exc:
        return wire.Reply(request.id, error=wire.INVALID, message=str(exc))
    except QueueFullError as exc:
        return wire.Reply(request.id, error=wire.FULL, message=str(exc), retry_after_s=exc.retry_after_s)
    except JaxcacheError as exc:
        return wire.Reply(request.id, error=wire.STOPPING, message=str(exc))
    except Exception as exc:  # noqa: BLE001 - the worker answers it as the route would have
        log.exception("ingesting a run record failed")
        return wire.Reply(request.id, error=wire.FAILED, message=f"ingesting the record failed: {exc}")
    return wire.Reply(request.id, wire.Result(r.cache, r.run_id, r.process_index, r.keys, r.stale))
