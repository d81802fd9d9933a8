"""What can be read from a serialized executable without JAX: the module name JAX puts in its leading protobuf
header (field 7), pinned by tests against CPU entries of JAX 0.10 and 0.12 (docs/jax-internals.md, "Entry bytes")."""

from __future__ import annotations

from collections.abc import Iterator

from jaxcache.entry import TIME_HEADER_BYTES

_MODULE_FIELD = 7


def embedded_module(head: bytes) -> str | None:
    """The module name inside a decompressed entry's serialized executable; None when it cannot be read."""
    body = head[TIME_HEADER_BYTES:]
    try:
        length, i = _varint(body, 0)
        header = body[i : i + length]
        if len(header) < length:
            return None
        for number, value in _fields(header):
            if number == _MODULE_FIELD and isinstance(value, bytes):
                return value.decode("utf-8")
    except (IndexError, ValueError, UnicodeDecodeError):
        return None
    return None


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i
        if shift > 63:
            raise ValueError("varint too long")


def _fields(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    i = 0
    while i < len(message):
        tag, i = _varint(message, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _varint(message, i)
            yield number, value
        elif wire == 2:
            length, i = _varint(message, i)
            yield number, message[i : i + length]
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
