"""A worker's report queue when ``jaxcache serve --workers`` runs a report writer process: records go to it over
the runtime directory's socket, and its answers come back. The writer ingests in a process of its own, so its
catalog work never holds the interpreter lock the worker's event loop needs (in a storm, a worker's own writer
thread had less than half of it). Same interface as :class:`~.queue.ReportQueue`, as the report route uses it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.service.ingestion import wire
from jaxcache.service.ingestion.packed import Report
from jaxcache.service.ingestion.queue import Arrival, QueueFullError
from jaxcache.service.ingestion.reports import IngestResult

#: How long a request waits for the writer's socket (the writer starting, or restarting after it died) before it
#: answers 503: the record is safe in its file anyway, and the client sends it again.
CONNECT_WAIT_S = 10.0


class RemoteReports:
    """Records sent to the report writer process at ``socket_path``; one connection per worker, opened at the
    first record and again after the writer restarts."""

    def __init__(self, socket_path: str | Path, *, connect_wait_s: float = CONNECT_WAIT_S) -> None:
        self.socket_path = str(socket_path)
        self.connect_wait_s = connect_wait_s
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[wire.Reply]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Task[asyncio.StreamWriter] | None = None
        self._full_until = 0.0  # monotonic: the writer said its queue was full until about then
        self._retry_after_s = 1
        self._texts = wire.Texts()  # this connection's (a new one for each)

    def check_room(self) -> None:
        """Refuse (QueueFullError) while the writer's last word was that its queue is full: before a body is
        parsed, as the local queue does."""
        if time.monotonic() < self._full_until:
            raise QueueFullError("the service's report writer has a full queue: try again later; the record file "
                                 "under the cache root reaches the catalog at the next rescan anyway",
                                 self._retry_after_s)

    @contextlib.contextmanager
    def arriving(self) -> Iterator[Arrival]:
        # The writer process batches what it has queued; it cannot wait for bodies another process still reads.
        yield Arrival()

    async def ingest(self, cache: str, record: Report, arrival: Arrival | None = None) -> IngestResult:
        """Ingest ``record`` through the writer; its result, or its error as the local queue raises it."""
        reply = await self._ask(lambda i: wire.Ingest(i, cache, self._packed(record)))
        if reply.error is None and reply.result is not None:
            r = reply.result
            return IngestResult(r.cache, r.run_id, r.process_index, r.keys, stale=r.stale)
        if reply.error == wire.INVALID:
            raise InvalidInputError(reply.message)
        if reply.error == wire.FULL:
            self._full_until = time.monotonic() + reply.retry_after_s
            self._retry_after_s = reply.retry_after_s
            raise QueueFullError(reply.message, reply.retry_after_s)
        if reply.error == wire.STOPPING:  # the writer is restarting: the serving process starts another
            raise self._unavailable(reply.message)
        raise JaxcacheError(reply.message or "the report writer could not ingest the record")

    async def settled(self, timeout_s: float) -> bool:
        """Whether the writer settled (everything taken ingested, explained and copied) within ``timeout_s``."""
        return (await self._ask(lambda i: wire.Settle(i, timeout_s))).settled

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _packed(self, record: Report) -> Report:
        """``record`` with the parts and programs this connection sent before as their numbers: called where the
        frame is made, so texts are numbered in the order frames are written (nothing awaits in between)."""
        return msgspec.structs.replace(record, parts=self._texts.pack(record.parts),
                                       programs=self._texts.pack(record.programs))

    async def _ask(self, make) -> wire.Reply:
        writer = await self._connected()
        request_id = next(self._ids)
        future: asyncio.Future[wire.Reply] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            writer.write(wire.frame(make(request_id)))
            await writer.drain()
            return await future
        except (ConnectionError, OSError) as exc:
            raise self._unavailable(f"its connection broke ({exc})") from None
        finally:
            self._waiting.pop(request_id, None)

    async def _connected(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        # One attempt at a time, shared: requests that arrive while the writer is away all wait for the same one.
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> asyncio.StreamWriter:
        deadline = time.monotonic() + self.connect_wait_s
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
                break
            except OSError as exc:  # not listening yet, or gone: it is (re)starting
                if time.monotonic() >= deadline:
                    raise self._unavailable(f"its socket does not answer ({exc})") from None
                await asyncio.sleep(0.1)
        self._writer, self._texts = writer, wire.Texts()
        asyncio.get_running_loop().create_task(self._replies(reader, writer))
        return writer

    async def _replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Hand each reply to the request waiting for it; when the connection ends, fail those still waiting."""
        try:
            while (reply := await wire.read_reply(reader)) is not None:
                future = self._waiting.get(reply.id)
                if future is not None and not future.done():
                    future.set_result(reply)
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()
            lost = self._unavailable("it stopped before answering")
            for future in list(self._waiting.values()):
                if not future.done():
                    future.set_exception(lost)

    def _unavailable(self, why: str) -> QueueFullError:
        return QueueFullError(f"the service's report writer is not available: {why}. Send the record again in a "
                              "moment (sending it twice changes nothing); the record file under the cache root "
                              "reaches the catalog at the next rescan anyway", 1)
