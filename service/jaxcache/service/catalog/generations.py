"""Each cache's change counts (entries, usage), behind cached statistics and ETags in every replica. A count only
grows, to max(next, time in µs), so a rebuilt catalog never hands back a client's stale ``ETag`` as current."""

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
    # Built once: every listing reads it, and building it cost as much as running it.
    return select(ChangeCountRow.entries, ChangeCountRow.usage).where(ChangeCountRow.cache == bindparam("cache"))


class Generations:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def get(self, cache: str) -> Generation:
        with self.catalog.statements() as conn:
            row = conn.execute(_counts(), {"cache": cache}).first()
        return Generation() if row is None else Generation(row.entries, row.usage)

    def bump(self, cache: str, *what: str) -> None:
        """Count a change of ``what`` in ``cache``; call after the change's commit, so a new count implies it."""
        now = int(time.time() * 1e6)
        table = ChangeCountRow.__table__
        moved = {w: case((table.c[w] + 1 > now, table.c[w] + 1), else_=literal(now)) for w in what}
        first = {w: now if w in what else 0 for w in (ENTRIES, USAGE)}
        with self.catalog.session() as s:  # one statement, a write: no read before it
            s.execute(self.catalog.insert(ChangeCountRow).values(cache=cache, **first)
                      .on_conflict_do_update(index_elements=["cache"], set_=moved))
