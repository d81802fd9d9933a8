"""Registering the configured caches at start, and keeping or dropping a cache's job history when its root changed
(``JAXCACHE_ROOT_CHANGED``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import (
    EMPTY,
    CacheRow,
    EntryRow,
    KeyHistoryRow,
    KeyStatsRow,
    ProcessKeysRow,
    RecordFileRow,
    RunRow,
    UsageRow,
)
from jaxcache.units import plural

log = logging.getLogger("jaxcache.service")

RootChanged = Literal["keep", "drop"]


@dataclass(frozen=True, slots=True)
class RootChange:
    """A cache served from another root than the catalog last saw, and what became of its job history."""

    cache: str
    old: str
    new: str
    runs: int  # runs of the cache's jobs the catalog held
    dropped: bool

    def line(self) -> str:
        runs = plural(self.runs, "run")
        done = (f"its job history from the old root ({runs}) was dropped" if self.dropped else
                f"its job history from the old root ({runs}) is kept and shown with the new root's; "
                "JAXCACHE_ROOT_CHANGED=drop drops it at the next start")
        return f"cache {self.cache!r}: root changed from {self.old} to {self.new}; {done}"


def register(catalog: Catalog, roots: Mapping[str, str], policy: RootChanged) -> list[RootChange]:
    """Record each cache's root; for a changed one, keep or drop its job history per ``policy``, and log it."""
    changes = []
    for name, url in roots.items():
        # The cache's writing lock: no report of the old root is folded between the count and the deletion.
        with catalog.writing(name) as s:
            old = s.scalar(select(CacheRow.url).where(CacheRow.name == name))
            if old is not None and old != url:
                runs = s.scalar(select(func.count(func.distinct(RunRow.run_id))).where(RunRow.cache == name)) or 0
                if policy == "drop":
                    _drop_history(s, name)
                changes.append(RootChange(name, old, url, runs, dropped=policy == "drop"))
            # An upsert: replicas starting together register the same caches.
            s.execute(catalog.insert(CacheRow).values(name=name, url=url)
                      .on_conflict_do_update(index_elements=["name"], set_={"url": url}))
    for change in changes:
        # INFO: `jaxcache serve` prints the line itself, and a WARNING would reach stderr twice.
        log.info("%s", change.line())
    return changes


def _drop_history(s: Session, cache: str) -> None:
    """Delete what the catalog learnt from the cache's run records; entry rows stay but lose their copied figures."""
    for table in (RunRow, ProcessKeysRow, UsageRow, KeyStatsRow, KeyHistoryRow):
        s.execute(delete(table).where(table.cache == cache))
    # Read again from the new root at the next rescan: a record file of the same name there is not the old one.
    s.execute(delete(RecordFileRow).where(RecordFileRow.cache == cache))
    # No compacted history is left for a record to be older than.
    s.execute(update(CacheRow).where(CacheRow.name == cache).values(compacted_before_s=None))
    s.execute(update(EntryRow).where(EntryRow.cache == cache).values(**EMPTY,
                                                                      last_used_s=EntryRow.seen_used_s))
