"""Aggregate figures over a stream of scan records, in one pass and constant memory per function name."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from jaxcache.entry import Status
from jaxcache.scan import Entry, Orphan, Record


@dataclass(slots=True)
class FunctionStats:
    """Totals for one jitted function (module name)."""

    entries: int = 0
    size_bytes: int = 0
    compile_seconds: int = 0


@dataclass(slots=True)
class CacheStats:
    """What ``jaxcache stats`` reports for a cache root."""

    entries: int = 0
    size_bytes: int = 0
    compile_seconds: int = 0
    orphans: int = 0
    orphan_bytes: int = 0
    corrupt: int = 0
    with_atime: int = 0
    oldest_mtime_s: float | None = None
    newest_mtime_s: float | None = None
    by_function: dict[str, FunctionStats] = field(default_factory=dict)
    by_compression: Counter[str] = field(default_factory=Counter)

    def add(self, record: Record) -> None:
        """Fold one record into the totals."""
        if isinstance(record, Orphan):
            self.orphans += 1
            self.orphan_bytes += record.size_bytes
            return
        self._add_entry(record)

    def _add_entry(self, e: Entry) -> None:
        # Once per entry of a root (100k and more, after a listing the head index answers): locals, few lookups.
        size = e.size_bytes
        seconds = e.compile_seconds or 0
        mtime = e.mtime_s
        self.entries += 1
        self.size_bytes += size
        self.compile_seconds += seconds
        if e.status is Status.CORRUPT:
            self.corrupt += 1
        if e.atime_ns is not None:
            self.with_atime += 1
        if e.compression is not None:
            # The member itself: a StrEnum is the str of its value (same hash, equal), without the .value lookup.
            self.by_compression[e.compression] += 1
        fs = self.by_function.get(e.module)
        if fs is None:
            fs = self.by_function[e.module] = FunctionStats()
        fs.entries += 1
        fs.size_bytes += size
        fs.compile_seconds += seconds
        oldest = self.oldest_mtime_s
        if oldest is None or mtime < oldest:
            self.oldest_mtime_s = mtime
        newest = self.newest_mtime_s
        if newest is None or mtime > newest:
            self.newest_mtime_s = mtime

    @property
    def mixed_compression(self) -> bool:
        """True when both zstd and zlib writers have used this root (they can never hit each other)."""
        return self.by_compression["zstd"] > 0 and self.by_compression["zlib"] > 0


def summarize(records: Iterable[Record]) -> CacheStats:
    """One pass over ``records``."""
    stats = CacheStats()
    for record in records:
        stats.add(record)
    return stats


MIXED_COMPRESSION_ADVICE = (
    "entries written by processes with and without zstandard can never hit each other: the compression "
    "library is part of JAX's cache key. Install zstandard in every job and warm-up image (jaxcache depends "
    "on it), then prune the zlib entries once no job writes them."
)
