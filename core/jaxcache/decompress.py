"""Decompressing a whole entry as a stream, with memory bounded by :data:`OUT_BYTES` however it was compressed.

Feeding a decompressor 1 MiB at a time does not bound what comes out: a zstd block of four bytes can stand for
128 KiB, so a file of a few KiB can declare gigabytes (a decompression bomb, written by anyone who can write the
bucket, would take the verifier's memory). Output is handed to a sink in pieces as it is made, never gathered.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterable
from typing import IO, cast

import zstandard

#: The largest piece of decompressed output held at once.
OUT_BYTES = 1 << 20
# Frames that do not declare their size (JAX's always do) are fed this little at a time: zstd's largest expansion
# is about 32,768 to 1, so no call makes more than about 8 MiB.
_UNSIZED_IN_BYTES = 256

Sink = Callable[[bytes], None]


class StreamDamage(Exception):
    """The stream is not one whole, clean compressed stream; the message says how."""


def zlib_stream(chunks: Iterable[bytes], sink: Sink) -> None:
    """Inflate a zlib stream into ``sink``; raises :class:`StreamDamage` (or ``zlib.error``) when damaged."""
    dec = zlib.decompressobj()
    for chunk in chunks:
        if _ended(dec):
            if chunk:
                raise StreamDamage("trailing bytes after the end of the compressed stream")
            continue
        data = chunk
        while data:
            out = dec.decompress(data, OUT_BYTES)  # at most OUT_BYTES; the rest waits in unconsumed_tail
            if out:
                sink(out)
            if _ended(dec):
                if dec.unused_data:
                    raise StreamDamage("trailing bytes after the end of the compressed stream")
                break
            data = dec.unconsumed_tail
    if not _ended(dec):
        rest = dec.flush()
        if rest:
            sink(rest)
        if not _ended(dec):
            raise StreamDamage("truncated: the zlib stream stops early")


def zstd_stream(first: bytes, chunks: Iterable[bytes], sink: Sink, dctx: zstandard.ZstdDecompressor) -> None:
    """Decompress one zstd frame (``first`` holds its header) into ``sink``; raises :class:`StreamDamage` (or
    ``zstandard.ZstdError``) when damaged."""
    declared = zstandard.frame_content_size(first)
    if declared < 0:
        _zstd_unsized(first, chunks, sink, dctx)
        return
    made = 0

    def counted(out: bytes) -> None:
        nonlocal made
        made += len(out)
        if made > declared:
            raise StreamDamage("trailing bytes after the end of the compressed stream (a second frame)")
        sink(out)

    # A stream writer hands its output on in pieces of write_size as it makes them; it does not say where its
    # input ended, hence the count against the size the frame declares.
    writer = dctx.stream_writer(cast(IO[bytes], _Forward(counted)), write_size=OUT_BYTES, closefd=False)
    writer.write(first)
    for chunk in chunks:
        writer.write(chunk)
    writer.flush()  # type: ignore[no-untyped-call]  # zstandard's stubs leave it untyped
    if made < declared:
        raise StreamDamage(f"truncated: the zstd frame stops early ({made} of the {declared} bytes it declares)")


def _zstd_unsized(first: bytes, chunks: Iterable[bytes], sink: Sink, dctx: zstandard.ZstdDecompressor) -> None:
    dec = dctx.decompressobj()
    for chunk in itertools.chain((first,), chunks):
        for start in range(0, len(chunk), _UNSIZED_IN_BYTES):
            if _ended(dec):
                raise StreamDamage("trailing bytes after the end of the compressed stream")
            out = dec.decompress(chunk[start : start + _UNSIZED_IN_BYTES])
            if out:
                sink(out)
            if _ended(dec) and dec.unused_data:
                raise StreamDamage("trailing bytes after the end of the compressed stream")
    if not _ended(dec):
        raise StreamDamage("truncated: the zstd frame stops early")


def _ended(dec: zlib._Decompress | zstandard.ZstdDecompressionObj) -> bool:
    # A function, not the attribute inline: a type checker takes an attribute tested once as fixed from then on.
    return bool(dec.eof)


class _Forward:
    """The file-like object a zstd stream writer writes to: each piece goes straight to the sink."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    def write(self, data: bytes) -> int:
        self._sink(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass
