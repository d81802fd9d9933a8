"""The report writer process's two ends in one process: a worker's RemoteReports talking to writer.serve over a
real unix socket, with a real catalog. Records come back with the results the local queue gives; when no writer
listens, or it goes away with records in flight, the worker answers 503 with Retry-After, never a traceback.
Its life as a process of `jaxcache serve --workers`: tests/test_service_workers.py."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import msgspec
import pytest

from jaxcache.keyparts import KeyParts, ProgramSignature
from jaxcache.records import RunRecord
from jaxcache.service.ingestion import wire, writer
from jaxcache.service.ingestion.packed import report_of
from jaxcache.service.ingestion.queue import QueueFullError
from jaxcache.service.ingestion.remote import RemoteReports
from jaxcache.service.state import State
from reports_support import compiled, hit, keys_of, run, settings, sha

PATIENCE_S = 60


class Writer:
    """writer.serve in a thread of its own, with its own event loop, until :meth:`stop`."""

    def __init__(self, state: State, path: Path) -> None:
        self.state, self.path = state, path
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(writer.serve(state.reports, path, self._stop),), daemon=True)
        self._thread.start()
        deadline = time.monotonic() + PATIENCE_S
        while not (path.parent / wire.PID_NAME).exists():
            assert time.monotonic() < deadline, "the writer never listened"
            time.sleep(0.01)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(PATIENCE_S)
        self._loop.close()


@pytest.fixture
def state(tmp_path, cache_copy):
    s = State(settings(tmp_path, {"demo": str(cache_copy)}))
    yield s
    s.catalog.dispose()


def _runs(tmp_path: Path) -> list[tuple]:
    with sqlite3.connect(tmp_path / "catalog.sqlite") as db:
        return db.execute("SELECT run_id, process_index, keys FROM runs ORDER BY process_index").fetchall()


def test_records_go_through_the_writer_and_come_back_with_their_results(tmp_path, state, jax_caches):
    path = tmp_path / "runtime" / wire.SOCKET_NAME
    path.parent.mkdir()
    served = Writer(state, path)
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    at = time.time()
    records = [run("j", "r1", [hit(train, 2, at)], at=at, process_index=p, process_count=3) for p in range(3)]
    remote = RemoteReports(path)

    async def send() -> list:
        results = await asyncio.gather(*(remote.ingest("demo", report_of(r)) for r in records))
        older = run("j", "r1", [hit(train, 1, at - 10)], at=at - 10, process_index=0, process_count=3)
        again = await remote.ingest("demo", report_of(older))  # an older version of a record in changes nothing
        settled = await remote.settled(PATIENCE_S)
        remote.close()
        return [*results, again, settled]

    try:
        *results, again, settled = asyncio.run(send())
    finally:
        served.stop()
    assert [(r.cache, r.run_id, r.process_index, r.keys, r.stale) for r in results] == [
        ("demo", "r1", p, 1, False) for p in range(3)]
    assert again.stale and settled
    assert _runs(tmp_path) == [("r1", p, 1) for p in range(3)]


def test_without_a_writer_a_record_is_refused_for_a_moment(tmp_path):
    remote = RemoteReports(tmp_path / wire.SOCKET_NAME, connect_wait_s=0.3)
    with pytest.raises(QueueFullError) as refused:
        asyncio.run(remote.ingest("demo", report_of(run("j", "r1", []))))
    assert refused.value.retry_after_s == 1
    assert "report writer is not available" in str(refused.value)
    assert "reaches the catalog at the next rescan" in str(refused.value)


def test_requests_waiting_for_an_absent_writer_share_one_wait(tmp_path):
    """Eight requests at once with no writer: all refused after one wait for its socket, not one wait each."""
    remote = RemoteReports(tmp_path / wire.SOCKET_NAME, connect_wait_s=1.0)

    async def main() -> list:
        return await asyncio.gather(*(remote.ingest("demo", report_of(run("j", "r1", [], process_index=p,
                                                                          process_count=8)))
                                      for p in range(8)), return_exceptions=True)

    began = time.monotonic()
    answers = asyncio.run(main())
    assert time.monotonic() - began < 4.0
    assert all(isinstance(a, QueueFullError) for a in answers)


def test_records_in_flight_when_the_writer_goes_are_refused_for_a_moment(tmp_path):
    """A writer that reads a request and goes away: the waiting request is answered, not left hanging."""
    path = tmp_path / wire.SOCKET_NAME

    async def main() -> None:
        async def vanish(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await wire.read_request(reader)
            w.close()

        server = await asyncio.start_unix_server(vanish, path=str(path))
        async with server:
            remote = RemoteReports(path)
            with pytest.raises(QueueFullError, match="stopped before answering"):
                await asyncio.wait_for(remote.ingest("demo", report_of(run("j", "r1", []))), PATIENCE_S)

    asyncio.run(main())


def test_texts_travel_once_per_connection_and_start_again_at_the_limit(monkeypatch):
    monkeypatch.setattr(wire.Texts, "LIMIT", 3)
    sender, receiver = wire.Texts(), wire.Texts()
    frames = [["a", None, "b"], ["a", "b", None], ["c", "a"], ["d", "a", "d"]]
    packed = [sender.pack(f) for f in frames]
    assert packed[:3] == [["a", None, "b"], [0, 1, None], ["c", 0]]
    assert packed[3] == ["d", "a", 0]  # "d" was the fourth text: both ends started again, and "a" with them
    assert [receiver.unpack(p) for p in packed] == frames


def _usage_parts(tmp_path: Path) -> list[tuple]:
    with sqlite3.connect(tmp_path / "catalog.sqlite") as db:
        return db.execute("SELECT run_id, parts IS NOT NULL, program IS NOT NULL FROM usage ORDER BY run_id").fetchall()


def test_a_keys_parts_reach_the_catalog_from_every_connection(tmp_path, state, jax_caches):
    """Parts and programs sent once per connection as text, then as numbers: each run's rows have them, and a new
    connection (a writer restarted, or another worker) starts its numbering again."""
    path = tmp_path / "runtime" / wire.SOCKET_NAME
    path.parent.mkdir()
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    at = time.time()
    parts = KeyParts(computation=sha("computation"), devices=sha("devices"))
    program = ProgramSignature(args=("f32[8]",), results=("f32[8]",))

    def record(run_id: str, p: int = 0) -> RunRecord:
        usage = msgspec.structs.replace(compiled(train, 1.0, at), parts=parts, program=program)
        return run("j", run_id, [usage], at=at, process_index=p, process_count=2)

    async def send(run_ids: list[str]) -> None:
        remote = RemoteReports(path)
        for run_id in run_ids:
            for p in range(2):
                await remote.ingest("demo", report_of(record(run_id, p)))
        assert await remote.settled(PATIENCE_S)
        remote.close()

    served = Writer(state, path)
    try:
        asyncio.run(send(["r1", "r2"]))
        asyncio.run(send(["r3"]))
    finally:
        served.stop()
    assert _usage_parts(tmp_path) == [("r1", 1, 1), ("r2", 1, 1), ("r3", 1, 1)]
