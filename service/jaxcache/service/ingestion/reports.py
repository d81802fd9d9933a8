"""Folding run records into the run tables: one process's record at a time or a batch of them, in the caller's
write transaction (the drain's, :mod:`.drain`).

A record is rewritten while its process runs (its counts are totals so far), so folding one is an upsert per
(cache, run id, process index): the process's figures (:mod:`.figures`) are replaced, and with them its part of its
run's usage rows (one per key: the run's processes summed, :mod:`.groups`) and of its keys' aggregates, as
differences where that is exact, else rebuilt (:mod:`.aggregates`). Folding a record twice, an older version of
one, or one older than the cache's compaction watermark (its run may be in key_history already), changes nothing.
How the figures are defined: docs/service.md, "Run records".
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from jaxcache.attestations import FILE, REPORTED, Attestation, from_run
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.ingestion import attestations
from jaxcache.service.ingestion import explain as explaining
from jaxcache.service.ingestion.batch import Batch
from jaxcache.service.ingestion.explain import Pending
from jaxcache.service.ingestion.inbox import REPORT, STORAGE
from jaxcache.service.ingestion.packed import Report

__all__ = ["REPORT", "STORAGE", "Folded", "Item", "fold"]


@dataclass(frozen=True, slots=True)
class Item:
    """A record to fold, where it came from (REPORT or STORAGE) and, for a file, its name."""

    record: Report
    source: str
    name: str | None = None


@dataclass(slots=True)
class Folded:
    """What folding a batch did: records that changed the catalog (by source), those that were stale, and the
    misses explained for the first time (by cause)."""

    fresh: Counter[str] = field(default_factory=Counter)
    stale: int = 0
    misses: Counter[str] = field(default_factory=Counter)


def fold(catalog: Catalog, s: Session, cache: str, items: Sequence[Item], *, secret: bytes | None = None,
         root: str | None = None) -> Folded:
    """Fold ``items`` (in order within each source) into ``cache``'s run tables in ``s``, a write transaction the
    caller took with ``catalog.writing(cache)``: what a job's processes send at once share their runs' usage rows
    and their keys, so a batch reads and writes each once instead of once a record. Their misses are explained at
    the end, when every record is in, whatever order they came in; their digests recorded in the same
    transaction."""
    out = Folded()
    pending: list[Pending] = []
    found: list[Attestation] = []
    for source in (REPORT, STORAGE):
        mine = [i for i in items if i.source == source]
        if not mine:
            continue
        work = Batch(catalog, s, cache, source)
        work.load([i.record for i in mine])
        for item in mine:
            stale, _, attest = work.take(item.record)
            if stale:
                out.stale += 1
            else:
                out.fresh[source] += 1
            # Recorded for compacted records too: digests are evidence, never counts (the first accepted one
            # counts, the others are kept as conflicts), and a back-dated record must not hide a forged digest.
            if attest:
                found += _attestations(item, secret)
        more, counts = work.apply()
        pending += more
        out.misses.update(counts)
    if pending:
        out.misses.update(explaining.explain_pending(s, cache, pending, root=root))
    if found:
        attestations.record_in(catalog, s, cache, found)
    return out


def _attestations(item: Item, secret: bytes | None) -> list[Attestation]:
    record = item.record
    if not record.digests:
        return []
    # A POSTed digest came with a report token; one read from the bucket is worth what the bucket's writers are.
    kind = REPORTED if item.source == REPORT else FILE
    return list(from_run(record.attested(), source=kind, at=time.time(), secret=secret, record=item.name))
