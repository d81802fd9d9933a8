"""What a worker of ``jaxcache serve --workers`` and the report writer process say to each other over the unix
socket in the runtime directory: length-prefixed msgpack frames, a request and its reply sharing an id, so that
many requests wait on one connection at once. A report's parts and programs travel once per connection, then as
their number in the connection's :class:`Texts`."""

from __future__ import annotations

import asyncio
import struct

import msgspec

from jaxcache.service.ingestion.packed import Report

SOCKET_NAME = "reports.sock"
PID_NAME = "writer.pid"
#: A frame's length is a 4-byte big-endian unsigned int; a record is at most JAXCACHE_MAX_REPORT_BYTES of JSON,
#: less as msgpack, so this bounds only a confused peer.
MAX_FRAME = 1 << 30
_LENGTH = struct.Struct(">I")

# What the writer answers besides a result: the errors a worker turns back into its own exceptions.
INVALID, FULL, STOPPING, FAILED = "invalid", "full", "stopping", "failed"


class Ingest(msgspec.Struct, tag="ingest"):
    id: int
    cache: str
    record: Report


class Settle(msgspec.Struct, tag="settle"):
    id: int
    timeout_s: float


Request = Ingest | Settle


class Result(msgspec.Struct):
    cache: str
    run_id: str
    process_index: int
    keys: int
    stale: bool


class Reply(msgspec.Struct):
    id: int
    result: Result | None = None
    settled: bool = False
    error: str | None = None  # one of INVALID, FULL, STOPPING, FAILED
    message: str = ""
    retry_after_s: int = 1


_requests = msgspec.msgpack.Decoder(Request)
_replies = msgspec.msgpack.Decoder(Reply)
_encoder = msgspec.msgpack.Encoder()


class Texts:
    """One end's table of the texts (a key's parts or program, as JSON) sent on one connection: the first time as
    text, then as its number. A job's processes send the same parts for the same keys: they were 140 KB of a final
    record's 170 KB frame. Both ends number texts in the order frames are written and read, and start again at
    LIMIT."""

    LIMIT = 100_000

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}
        self._texts: list[str] = []

    def pack(self, texts: list[str | int | None]) -> list[str | int | None]:
        """The sender's side: each text already sent as its number (the new ones numbered)."""
        out: list[str | int | None] = []
        for text in texts:
            if isinstance(text, str):
                number = self._numbers.get(text)
                if number is None:
                    self._add(text)
                    self._numbers[text] = len(self._texts) - 1
                else:
                    text = number
            out.append(text)
        return out

    def unpack(self, texts: list[str | int | None]) -> list[str | int | None]:
        """The receiver's side: each number as the text it stands for (the new texts numbered)."""
        out: list[str | int | None] = []
        for text in texts:
            if isinstance(text, int):
                text = self._texts[text]
            elif text is not None:
                self._add(text)
            out.append(text)
        return out

    def _add(self, text: str) -> None:
        if len(self._texts) >= self.LIMIT:
            self._numbers.clear()
            self._texts.clear()
        self._texts.append(text)


def frame(message: Request | Reply) -> bytes:
    body = _encoder.encode(message)
    return _LENGTH.pack(len(body)) + body


async def _read(reader: asyncio.StreamReader) -> bytes | None:
    """One frame's body, or None at the end of the stream."""
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError:
        return None
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME:
        raise ValueError(f"a frame of {length} bytes: the peer is not a jaxcache report writer or worker")
    return await reader.readexactly(length)


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    body = await _read(reader)
    return None if body is None else _requests.decode(body)


async def read_reply(reader: asyncio.StreamReader) -> Reply | None:
    body = await _read(reader)
    return None if body is None else _replies.decode(body)
