"""How many times each cache has changed, by what changed, in the catalog (``change_counts``): what cached
statistics and the listings' ``ETag`` are checked against, in every process of every replica alike.

``ENTRIES`` moves when entry rows change (a rescan that found something, a prune, a DELETE), ``USAGE`` when run
records are folded (or compacted). A count only grows, and never repeats one an earlier catalog gave out: each
change sets it to the next number or to the time in microseconds, whichever is larger, so a catalog rebuilt from
scratch does not hand a client's stale ``ETag`` back as current.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from sqlalchemy import Select, bindparam, case, literal, select

from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import ChangeCountRow

ENTRIES, USAGE = "entries", "usage"


@dataclass(frozen=True, slots=True)
class Generation:
    """A cache's change counts at one moment: equal twice means nothing changed in between."""

    entries: int = 0
    usage: int = 0

    def tag(self) -> str:
        return f"{self.entries:x}.{self.usage:x}"


@functools.cache
def _counts() -> Select:
    # Built once: read for every listing request (its ETag), where building it cost as much as running it.
    return select(ChangeCountRow.entries, ChangeCountRow.usage).where(ChangeCountRow.cache == bindparam("cache"))


class Generations:
    """The change counts of one catalog's caches."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def get(self, cache: str) -> Generation:
        with self.catalog.side_statements() as conn:
            row = conn.execute(_counts(), {"cache": cache}).first()
        return Generation() if row is None else Generation(row.entries, row.usage)

    def bump(self, cache: str, *what: str) -> None:
        """Note that ``what`` (ENTRIES, USAGE) of ``cache`` changed: after the change's commit, so that whoever
        reads the new count reads the change too."""
        now = int(time.time() * 1e6)
        table = ChangeCountRow.__table__
        moved = {w: case((table.c[w] + 1 > now, table.c[w] + 1), else_=literal(now)) for w in what}
        first = {w: now if w in what else 0 for w in (ENTRIES, USAGE)}
        with self.catalog.side_write() as s:
            s.execute(self.catalog.insert(ChangeCountRow).values(cache=cache, **first)
                      .on_conflict_do_update(index_elements=["cache"], set_=moved))
