"""The on-disk format of JAX's persistent compilation cache, read without importing JAX.

A cache root holds, per compiled program, ``<module>-<sha256 hex>-cache`` (the entry) and, when JAX's own
LRU is on, ``<module>-<sha256 hex>-atime`` (8 bytes, little-endian ``time.time_ns()`` of the last access).
An entry is ``compress(compile_seconds as 4-byte big-endian ‖ serialized executable)`` where the
compression is zstd or zlib depending on what the *writing* process could import. See docs/jax-internals.md.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import os
import re
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import msgspec
import zstandard

from jaxcache import decompress
from jaxcache.errors import InvalidInputError
from jaxcache.units import format_bytes, parse_bytes

HASH_HEX_LEN = 64
TIME_HEADER_BYTES = 4
ATIME_BYTES = 8
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# A zstd block holds at most 128 KiB; a frame header is at most 18 bytes. Nothing legitimate needs more
# than this before the first byte of output appears.
_ZSTD_MAX_FIRST_BLOCK_END = 18 + 3 + 128 * 1024
_HASH_RE = re.compile(r"[0-9a-f]{64}")
_FIRST_READ_BYTES = 256
#: The most an entry may decompress to; beyond it, it is refused as a decompression bomb wherever an entry is checked
#: whole (docs/user-guide.md, "Settings": real executables are at most hundreds of MB).
MAX_DECOMPRESSED_ENV = "JAXCACHE_MAX_DECOMPRESSED_BYTES"
DEFAULT_MAX_DECOMPRESSED_BYTES = 4 << 30


def max_decompressed_bytes(env: Mapping[str, str] | None = None) -> int:
    """The limit :data:`MAX_DECOMPRESSED_ENV` sets (``8GiB``, a number of bytes), or the default."""
    text = (os.environ if env is None else env).get(MAX_DECOMPRESSED_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_DECOMPRESSED_BYTES
    try:
        limit = parse_bytes(text)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{MAX_DECOMPRESSED_ENV}: {exc}") from None
    if limit < 1:
        raise InvalidInputError(f"{MAX_DECOMPRESSED_ENV}={text!r}: give a size of at least 1 byte (default 4GiB)")
    return limit


class EntryKind(enum.StrEnum):
    """Which of a key's two files an object is."""

    CACHE = "cache"
    ATIME = "atime"


class Compression(enum.StrEnum):
    """Compression of an entry, sniffed from its first bytes (never assumed)."""

    ZSTD = "zstd"
    ZLIB = "zlib"
    UNKNOWN = "unknown"


class Status(enum.StrEnum):
    """What a read of an entry found."""

    OK = "ok"
    CORRUPT = "corrupt"


# EntryName and Header are msgspec Structs (not dataclasses) for what a listing costs: one of each per entry read.
class EntryName(msgspec.Struct, frozen=True, gc=False):
    """A parsed object name: ``<module>-<hash>-<kind>``."""

    name: str
    key: str
    module: str
    hash: str
    kind: EntryKind


def parse_name(name: str) -> EntryName | None:
    """Parse an object name into key, module, hash and kind, or return None if JAX did not write it.

    Module names may contain ``-`` and ``.`` (``jit_odd-name.v2``), so the name is split from the right.
    """
    if name.endswith("-cache"):
        kind = EntryKind.CACHE
    elif name.endswith("-atime"):
        kind = EntryKind.ATIME
    else:
        return None
    key = name[:-6]
    # "<module>-" + 64 hex; the module is never empty in practice but an empty one still parses.
    if len(key) < HASH_HEX_LEN + 1 or key[-HASH_HEX_LEN - 1] != "-" or "/" in key:
        return None
    digest = key[-HASH_HEX_LEN:]
    if not _HASH_RE.fullmatch(digest):
        return None
    return EntryName(name=name, key=key, module=key[: -HASH_HEX_LEN - 1], hash=digest, kind=kind)


#: Every hex digit as "0", every other character as itself: a name's hash then reads "0" * 64 exactly where it was hex.
_HEX_AS_ZERO = str.maketrans("0123456789abcdef", "0" * 16)


def names_parse(joined: str, count: int, suffixes: tuple[str, ...] = ("-cache", "-atime")) -> bool:
    """True when :func:`parse_name` accepts every one of the ``count`` names in ``joined``, each followed by a NUL
    and ending in one of ``suffixes``: the same test as a parse of each, made in a few passes in C over all of them
    (a listing of 100k entries spent 0.15 s parsing them one by one). False: some may not parse (or one holds a NUL,
    which no file name does): parse each then.
    """
    # With hex digits read as "0", a name parses exactly when it ends in "-" + "0" * 64 + its suffix (a key has no
    # "/"). Each such ending ends at a NUL, and at most one fits before each NUL (the suffixes differ in their last
    # letters), so every name has one exactly when there are as many as names.
    if "/" in joined or joined.count("\0") != count:
        return False
    zeroed = joined.translate(_HEX_AS_ZERO)
    found = 0
    for suffix in dict.fromkeys(suffixes):
        if suffix + "\0" in joined or not count:  # (a suffix no name has costs no pass)
            found += zeroed.count(("-" + "0" * HASH_HEX_LEN + suffix + "\0").translate(_HEX_AS_ZERO))
    return found == count


def is_valid_key(key: str) -> bool:
    """True when ``key`` has the shape JAX gives keys (``<module>-<64 hex>``)."""
    return parse_name(key + "-cache") is not None


def cache_name(key: str) -> str:
    """The object name of a key's entry."""
    return key + "-cache"


def atime_name(key: str) -> str:
    """The object name of a key's access-time file."""
    return key + "-atime"


def sniff_compression(prefix: bytes) -> Compression:
    """Tell zstd from zlib by the first bytes (zstd's magic number; zlib's CMF/FLG check)."""
    if prefix[:4] == ZSTD_MAGIC:
        return Compression.ZSTD
    if len(prefix) >= 2:
        cmf, flg = prefix[0], prefix[1]
        if cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf * 256 + flg) % 31 == 0:
            return Compression.ZLIB
    return Compression.UNKNOWN


def decode_atime(data: bytes) -> int | None:
    """Decode an ``-atime`` file: 8 bytes little-endian nanoseconds since the epoch; None if malformed."""
    if len(data) != ATIME_BYTES:
        return None
    time_ns: int = struct.unpack("<Q", data)[0]
    return time_ns


def encode_atime(time_ns: int) -> bytes:
    """Encode nanoseconds since the epoch as JAX's LRU does."""
    return struct.pack("<Q", time_ns)


class Header(msgspec.Struct, frozen=True, gc=False):
    """What the first bytes of an entry say: compression and the stored (whole-second) compile time."""

    compression: Compression
    compile_seconds: int | None
    status: Status
    reason: str | None = None


_local = threading.local()


def _zstd() -> zstandard.ZstdDecompressor:
    # Decompressor contexts are costly to build and not thread-safe: one per thread.
    d = getattr(_local, "zstd", None)
    if d is None:
        d = _local.zstd = zstandard.ZstdDecompressor()
    return d


def _zstd_first_block_end(prefix: bytes) -> int | None:
    """Offset just past the first block of a zstd frame, from its headers; None if the prefix is too short."""
    if len(prefix) < 5:
        return None
    fhd = prefix[4]
    single_segment = (fhd >> 5) & 1
    fcs_code = fhd >> 6
    did_code = fhd & 3
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[did_code]
    pos += (1 if single_segment else 0, 2, 4, 8)[fcs_code]
    if len(prefix) < pos + 3:
        return None
    block_header = int.from_bytes(prefix[pos : pos + 3], "little")
    block_type = (block_header >> 1) & 3
    block_size = block_header >> 3
    return pos + 3 + (1 if block_type == 1 else block_size)


def _damage(compression: Compression, exc: Exception) -> str:
    if compression is Compression.ZLIB:
        return f"zlib stream is damaged (bad checksum or data): {exc}"
    return f"zstd frame is damaged: {exc}"


def _unknown_format(prefix: bytes) -> str:
    return f"not a zstd or zlib stream (starts with {prefix[:4].hex(' ') or 'nothing'}): not written by JAX"


def read_header(
    read_range: Callable[[int, int], bytes], size_bytes: int, *, first_read_bytes: int = _FIRST_READ_BYTES
) -> Header:
    """Read an entry's compression and stored compile seconds from as few bytes as possible.

    ``read_range(offset, length)`` returns up to ``length`` bytes at ``offset``. The first read asks for
    ``first_read_bytes`` (256 by default: enough for zlib). A zstd frame yields no output until its first block
    is complete, so if that block is not all there, a second read fetches exactly up to its end (sized from the
    block header). Only the bytes needed are decompressed.
    """
    if size_bytes == 0:
        return Header(Compression.UNKNOWN, None, Status.CORRUPT, "empty file (0 bytes): a write that never finished")
    data = read_range(0, min(max(first_read_bytes, 16), size_bytes))
    compression = sniff_compression(data)
    if compression is Compression.UNKNOWN:
        return Header(compression, None, Status.CORRUPT, _unknown_format(data))
    try:
        if compression is Compression.ZLIB:
            out = _zlib_head(read_range, data, size_bytes)
        else:
            out = _zstd_head(read_range, data, size_bytes)
    except (zstandard.ZstdError, zlib.error) as exc:
        return Header(compression, None, Status.CORRUPT, _damage(compression, exc))
    if len(out) < TIME_HEADER_BYTES:
        return Header(
            compression, None, Status.CORRUPT,
            f"truncated: {size_bytes} bytes end before the 4-byte compile-time header",
        )
    return Header(compression, int.from_bytes(out[:TIME_HEADER_BYTES], "big"), Status.OK)


def _zlib_head(read_range: Callable[[int, int], bytes], data: bytes, size_bytes: int) -> bytes:
    dec = zlib.decompressobj()
    # max_length: inflate only the 4 bytes wanted, however much was read.
    out = dec.decompress(data, TIME_HEADER_BYTES)
    if len(out) < TIME_HEADER_BYTES and len(data) < size_bytes:
        out += dec.decompress(dec.unconsumed_tail + read_range(len(data), size_bytes - len(data)), TIME_HEADER_BYTES)
    return out


def _zstd_head(read_range: Callable[[int, int], bytes], data: bytes, size_bytes: int) -> bytes:
    dec = _zstd().decompressobj()
    end = _zstd_first_block_end(data)
    if end is None or end > _ZSTD_MAX_FIRST_BLOCK_END:
        end = min(size_bytes, _ZSTD_MAX_FIRST_BLOCK_END)  # a damaged header: read what a block may hold
    if len(data) >= end:
        return dec.decompress(data[:end])
    out = dec.decompress(data)
    have = len(data)
    if have < size_bytes:
        out += dec.decompress(read_range(have, min(end, size_bytes) - have))
    return out


def read_header_bytes(data: bytes) -> Header:
    """:func:`read_header` over bytes already in memory."""
    return read_header(lambda offset, length: data[offset : offset + length], len(data))


@dataclass(frozen=True, slots=True)
class Validation:
    """The result of decompressing a whole entry."""

    status: Status
    compression: Compression
    reason: str | None = None
    compile_seconds: int | None = None
    executable_bytes: int | None = None
    head: bytes = b""  # the first HEAD_BYTES decompressed bytes (compile-time header + start of the executable)


HEAD_BYTES = 64 * 1024


def validate_chunks(chunks: Iterable[bytes], *, max_bytes: int | None = None) -> Validation:
    """Decompress a whole entry from a stream of chunks, keeping only counts (memory stays bounded).

    ``ok`` means the stream decompresses completely, ends where the frame ends, and holds a compile-time
    header plus a non-empty executable of at most ``max_bytes`` in all (default :func:`max_decompressed_bytes`;
    a zstd frame that declares more is refused before any of it is decompressed). zlib's adler32 catches any
    damaged byte; a zstd frame from JAX has no checksum, so a flipped byte inside its data may decompress cleanly
    (only a digest recorded at write time can catch that).
    """
    limit = max_decompressed_bytes() if max_bytes is None else max_bytes
    too_large = (f"expands to more than {format_bytes(limit)} (a decompression bomb, or an executable larger than"
                 f" {MAX_DECOMPRESSED_ENV} allows)")
    it = iter(chunks)
    first = b""
    for chunk in it:
        if chunk:
            first = chunk
            break
    if not first:
        return Validation(Status.CORRUPT, Compression.UNKNOWN, "empty file (0 bytes): a write that never finished")
    compression = sniff_compression(first)
    if compression is Compression.UNKNOWN:
        return Validation(Status.CORRUPT, compression, _unknown_format(first))
    head = bytearray()
    total = 0

    def sink(out: bytes) -> None:
        nonlocal total
        if len(head) < HEAD_BYTES:
            head.extend(out[: HEAD_BYTES - len(head)])
        total += len(out)
        if total > limit:
            raise decompress.StreamDamage(too_large)

    try:
        if compression is Compression.ZSTD:
            if zstandard.frame_content_size(first) > limit:
                raise decompress.StreamDamage(too_large)
            decompress.zstd_stream(first, it, sink, _zstd())
        else:
            decompress.zlib_stream(itertools.chain((first,), it), sink)
    except decompress.StreamDamage as exc:
        return Validation(Status.CORRUPT, compression, str(exc))
    except (zstandard.ZstdError, zlib.error) as exc:
        return Validation(Status.CORRUPT, compression, _damage(compression, exc))
    if total <= TIME_HEADER_BYTES:
        return Validation(Status.CORRUPT, compression, "no executable after the compile-time header")
    seconds = int.from_bytes(head[:TIME_HEADER_BYTES], "big")
    return Validation(Status.OK, compression, None, seconds, total - TIME_HEADER_BYTES, bytes(head))


def validate_hashing(chunks: Iterable[bytes]) -> tuple[Validation, str, int]:
    """:func:`validate_chunks` while hashing the same stream, read once (an entry of hundreds of MB stays out of
    memory): what the decompression found, the sha256 of every byte, and their count. The digest covers the bytes
    the decompression left unread (after damage, or past the frame's end) too: it is the stored object's, the one
    writers record and sign, which a check of an entry compares with."""
    digest, size = hashlib.sha256(), 0

    def hashed() -> Iterator[bytes]:
        nonlocal size
        for chunk in chunks:
            digest.update(chunk)
            size += len(chunk)
            yield chunk

    stream = hashed()
    validation = validate_chunks(stream)
    for _ in stream:
        pass
    return validation, digest.hexdigest(), size


def validate(data: bytes, *, max_bytes: int | None = None) -> Validation:
    """Decompress a whole entry held in memory; see :func:`validate_chunks`."""
    return validate_chunks([data], max_bytes=max_bytes)
