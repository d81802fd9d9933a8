"""A cache's prune candidates from its catalog, as columns (numbers in arrays, shared texts once); a
:class:`Candidate` is made only for a row someone reads."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import cached_property

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from jaxcache import entry as fmt
from jaxcache import prune
from jaxcache.prune.candidates import newest_use
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import EntryRow, VerificationRow


class CatalogCandidates(prune.CandidateColumns):
    """A cache's rows, one candidate each; object names are the key's (``<key>-cache``, an orphan's ``<key>-atime``)."""

    def __init__(self, verdicts: dict[str, str]) -> None:
        self._verdicts = verdicts
        self._texts: dict[str | None, str | None] = {}
        self.keys: list[str] = []
        self.modules: list[str] = []
        self.sizes: array[int] = array("q")
        self.created: array[float] = array("d")
        self.last_used: array[float] = array("d")  # as storage shows it: Candidate.last_used_s
        self.last_use: array[float] = array("d")  # with reported hits: what LRU compares
        self.statuses: list[str | None] = []
        self.orphan: list[bool] = []
        self.versions: list[str | None] = []
        self.has_atime = bytearray()
        self.last_hits: list[float | None] = []
        self.writer_jaxlib: list[str | None] = []

    def add(self, rows: Sequence[Sequence]) -> None:
        """Append rows of :data:`_ROWS`, column by column."""
        if not rows:
            return
        (keys, modules, sizes, created, seen, statuses, kinds, versions, has_atime, hits,
         writers) = zip(*rows, strict=True)
        one = self._texts.setdefault  # one string per distinct text: the driver makes one a row
        self.keys += keys
        self.modules += map(one, modules, modules)  # type: ignore[arg-type]
        self.sizes.extend(sizes)
        self.created.extend(created)
        self.last_used.extend(seen)
        self.last_use.extend(map(newest_use, seen, hits))
        self.statuses += map(one, statuses, statuses)
        self.orphan += [kind == "orphan" for kind in kinds]
        self.versions += versions
        self.has_atime.extend(map(bool, has_atime))
        self.last_hits += hits
        self.writer_jaxlib += map(one, writers, writers)

    def __len__(self) -> int:
        return len(self.keys)

    def candidate(self, row: int) -> prune.Candidate:
        key, orphan = self.keys[row], self.orphan[row]
        return prune.Candidate(
            key, self.modules[row], fmt.atime_name(key) if orphan else fmt.cache_name(key), self.sizes[row],
            self.created[row], self.last_used[row], self.statuses[row], orphan, self.versions[row], None,
            bool(self.has_atime[row]), self.last_hits[row], self.writer_jaxlib[row], self._verdicts.get(key))

    @cached_property
    def integrity(self) -> list[str | None]:
        verdicts = self._verdicts
        return [verdicts.get(k) for k in self.keys] if verdicts else [None] * len(self)

    @cached_property
    def entry_rows(self) -> Sequence[int]:
        return range(len(self)) if True not in self.orphan else [i for i, o in enumerate(self.orphan) if not o]


#: A cache's rows (the ``cache`` parameter), the columns :meth:`CatalogCandidates.add` takes.
_ROWS = select(EntryRow.key, EntryRow.module, EntryRow.size_bytes, EntryRow.created_s, EntryRow.seen_used_s,
               EntryRow.status, EntryRow.kind, EntryRow.version, EntryRow.has_atime, EntryRow.last_hit_s,
               EntryRow.writer_jaxlib).where(EntryRow.cache == bindparam("cache"))


def catalog_candidates(catalog: Catalog, cache: str, *, with_integrity: bool = False) -> CatalogCandidates:
    """``cache``'s candidates (entries and orphans) read in ``yield_per`` batches, with verdicts if asked."""
    verdicts: dict[str, str] = {}
    if with_integrity:
        with catalog.reader() as conn:
            verdicts = _classes_of(conn, cache)
    table = CatalogCandidates(verdicts)
    with catalog.reader() as conn:
        result = conn.execution_options(yield_per=10_000).execute(_ROWS, {"cache": cache})
        for rows in result.partitions():
            table.add(rows)
    return table


def _classes_of(conn: Connection, cache: str) -> dict[str, str]:
    """``{key: class}`` of every verified entry (for prune policies)."""
    v = VerificationRow
    return {r.key: r.classification for r in conn.execute(select(v.key, v.classification).where(v.cache == cache))}
