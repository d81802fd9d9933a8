"""What one process did with each key, as the catalog keeps it: one packed value per process (``process_keys``),
column by column, instead of a row per process and key. A run's usage rows sum these over its processes; a
process's next record replaces its figures there (its old ones subtracted, its new ones added), and the rows are
rebuilt from them when a sum cannot be undone (docs/service.md, "Run records").

A key's figures are a tuple indexed by the constants below: ingestion walks hundreds of thousands of them in a
storm, and a tuple from ``zip`` over the columns costs no Python code per key.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import zstandard

from jaxcache.records import COMPILED, HIT, JOB, WRITE, RunRecord

# The fields of one key's figures, in tuple order.
KEY, FUNCTION, EVENT, HITS, COMPILES, WRITES, REASON, COMPILE_S, RETRIEVAL_S, JAX_SAVED_S, SAVED_S, SIZE_BYTES, \
    FIRST_AT, LAST_AT = range(14)

#: How informative an event is: a usage row keeps its processes' most informative one.
RANK = {HIT: 0, COMPILED: 1, WRITE: 2}


class Figures(msgspec.Struct, array_like=True, gc=False):
    """One process's per-key figures as columns (the i-th value of each is the i-th key's); ``saved_s`` is what
    its hits saved by the catalog's measure when they were last weighed."""

    keys: list[str]
    functions: list[str]
    events: list[str]
    hits: list[int]
    compiles: list[int]
    writes: list[int]
    reasons: list[str | None]
    compile_s: list[float | None]
    retrieval_s: list[float]
    jax_saved_s: list[float]
    saved_s: list[float]
    size_bytes: list[int | None]
    first_at: list[float]
    last_at: list[float]

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """Each key's figures as a tuple (indexed by KEY, FUNCTION, ...)."""
        return zip(self.keys, self.functions, self.events, self.hits, self.compiles, self.writes, self.reasons,
                   self.compile_s, self.retrieval_s, self.jax_saved_s, self.saved_s, self.size_bytes, self.first_at,
                   self.last_at, strict=True)


EMPTY = Figures([], [], [], [], [], [], [], [], [], [], [], [], [], [])

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Figures)
#: Packed figures are compressed: a process's 200 keys take 31 KB as msgpack (their names half of it), 8.5 KB
#: compressed, and on PostgreSQL storing the larger value out of line cost the server more than compressing costs
#: here. Figures stored plain (before compression) still decode: msgpack never starts with zstd's magic number.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_compressor = zstandard.ZstdCompressor(level=1)
_decompressor = zstandard.ZstdDecompressor()


def of_record(record: RunRecord) -> Figures:
    """``record``'s keys as figures, their seconds saved not weighed yet (0)."""
    return of_keys(record.keys)


def of_keys(keys: Sequence[Any]) -> Figures:
    """Figures of a record's keys (:class:`jaxcache.records.KeyUsage`, or structs with the same fields)."""
    return Figures(
        [u.key for u in keys], [u.function for u in keys], [u.event for u in keys], [u.hits for u in keys],
        [u.compiles for u in keys], [u.writes for u in keys], [u.reason for u in keys], [u.compile_s for u in keys],
        [u.retrieval_s for u in keys], [u.saved_s for u in keys], [0.0] * len(keys), [u.size_bytes for u in keys],
        [u.first_at for u in keys], [u.last_at for u in keys])


def of_rows(rows: Sequence[tuple[Any, ...]]) -> Figures:
    """Figures from key tuples (the inverse of :meth:`Figures.rows`)."""
    if not rows:
        return EMPTY
    return Figures(*(list(column) for column in zip(*rows, strict=True)))


def encode(figures: Figures) -> bytes:
    return _compressor.compress(_encoder.encode(figures))


def decode(data: bytes) -> Figures:
    if data[:4] == _ZSTD_MAGIC:
        data = _decompressor.decompress(data)
    return _decoder.decode(data)


def used_hits(kind: str, hits: int) -> int:
    """The hits that count as use of a key: a job's. A warm-up's run is not use, and its verify run hits every key
    the warm-up just wrote; counted, they would make a warm-up "hit since" itself and keep its entries from LRU
    prunes. Their writes still count (a warm-up is often a key's first writer)."""
    return hits if kind == JOB else 0


def wrote(event: str, writes: int) -> bool:
    """Whether a key's figures record a write of it."""
    return writes > 0 or event == WRITE


def hit_at(hits: int, first_at: float, last_at: float) -> float | None:
    """When a key's figures last hit it (None: they never did)."""
    return (last_at or first_at or None) if hits else None


def is_miss(kind: str, event: str) -> bool:
    """A job's process compiled the key: the cache did not give it (jaxcache.explain.from_root.is_miss)."""
    return kind == JOB and event in (WRITE, COMPILED)


def saved_of(hits: int, retrieval_s: float, jax_saved_s: float, writer_compile_s: float | None) -> float:
    """Seconds saved by ``hits`` (that count as use) of a key whose first writer measured ``writer_compile_s``."""
    if not hits:
        return 0.0
    if writer_compile_s is not None:
        ours = hits * writer_compile_s - retrieval_s
        if ours > 0:
            return ours
    return max(jax_saved_s, 0.0)
