"""Full validation of a cache root: every entry decompressed, problems listed with what to do."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial

import msgspec

from jaxcache.entry import Status, validate_chunks
from jaxcache.errors import NotRegularFileError
from jaxcache.parallel import bounded_map
from jaxcache.scan import Orphan, Record, scan
from jaxcache.stats import MIXED_COMPRESSION_ADVICE, CacheStats
from jaxcache.storage.base import Skipped, Storage


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem: a corrupt entry, an orphaned ``-atime`` file, or an object skipped (not read)."""

    kind: str
    name: str
    key: str
    reason: str


@dataclass(slots=True)
class Diagnosis:
    """What ``jaxcache doctor`` found."""

    stats: CacheStats = field(default_factory=CacheStats)
    corrupt: list[Finding] = field(default_factory=list)
    orphans: list[Finding] = field(default_factory=list)
    skipped: list[Finding] = field(default_factory=list)  # the first Skipped.MAX_KEPT, by name
    skipped_total: int = 0

    @property
    def advice(self) -> list[str]:
        """Explanations a user should read, beyond the lists of files."""
        notes = []
        if self.stats.mixed_compression:
            notes.append(MIXED_COMPRESSION_ADVICE)
        if self.corrupt:
            notes.append(
                "JAX never repairs a corrupt entry: every job that needs it warns, recompiles, and skips the "
                "write because the file exists. Delete them (jobs recompile once and write a good copy): "
                "`jaxcache prune ROOT --corrupt --apply`, or remove the files listed."
            )
        if self.orphans:
            notes.append(
                "orphaned -atime files are harmless bookkeeping left after their entry was removed; "
                "deleting them frees a few bytes each."
            )
        if self.skipped_total:
            notes.append(
                "skipped objects are named like entries (or run records) but are not regular files (FIFOs, sockets, "
                "symbolic links, folders), have names that cannot be read safely (a backslash, a '..' part), or are "
                "stored with a Content-Encoding (which a store's library would decode, however large it grows): "
                "JAX did not write them, and nothing reads them. Find out who could write to the root, then remove "
                "them by hand."
            )
        return notes

    @property
    def problems(self) -> bool:
        """True when anything needs attention (the CLI exits 1)."""
        return bool(self.corrupt or self.orphans or self.skipped_total or self.stats.mixed_compression)

    def add(self, record: Record) -> None:
        """Fold one validated record in."""
        self.stats.add(record)
        if isinstance(record, Orphan):
            self.orphans.append(Finding("orphan", record.name, record.key, "-atime file without its -cache entry"))
        elif record.status is Status.CORRUPT:
            self.corrupt.append(Finding("corrupt", record.name, record.key, record.reason or "corrupt"))

    def add_skipped(self, skipped: Skipped) -> None:
        """Take in what the storage's listings and reads skipped (``storage.skipped``, once the scan is over)."""
        self.skipped = [Finding("skipped", name, "", why) for name, why in skipped.items()]
        self.skipped_total = skipped.count


def _check(storage: Storage, record: Record) -> Record | None:
    if isinstance(record, Orphan):
        return record
    try:
        chunks = storage.read_chunks(record.name)  # a stream: memory stays bounded whatever the entry's size
    except NotRegularFileError:
        return None  # replaced by a FIFO, a link or a folder since the listing: skipped (and counted)
    if chunks is None:  # deleted since it was listed (a prune, JAX's LRU): nothing left to judge
        return None
    v = validate_chunks(chunks)
    return msgspec.structs.replace(
        record, compression=v.compression, compile_seconds=v.compile_seconds, status=v.status, reason=v.reason
    )


def check(storage: Storage, records: Iterable[Record] | None = None, *, workers: int | None = None) -> Iterator[Record]:
    """Yield each record of ``records`` (default: a scan of ``storage``) with a full validation result."""
    if records is None:
        records = scan(storage, read_headers=False)
    if workers is None:
        workers = storage.io_workers
    for checked in bounded_map(partial(_check, storage), records, workers=workers):
        if checked is not None:
            yield checked


def diagnose(records: Iterable[Record], skipped: Skipped | None = None) -> Diagnosis:
    """Fold validated records (from :func:`check`) into a :class:`Diagnosis`, with what the scan skipped
    (``storage.skipped``, read once the records are all in)."""
    diagnosis = Diagnosis()
    for record in records:
        diagnosis.add(record)
    if skipped is not None:
        diagnosis.add_skipped(skipped)
    return diagnosis

