"""What a plan is made of: candidates (one object each, or a table of columns) and decisions about them.

A plan reads one or two fields of every candidate and decides about a few; a table of columns lets it do that
without an object per candidate, and :class:`Decisions` makes a decision's objects only when someone reads it (a
dry run's table shows 50 of 100k deletions).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import overload

from jaxcache.scan import Entry, Orphan


@dataclass(frozen=True, slots=True)
class Candidate:
    """One thing a prune may delete: an entry (its ``-cache`` file, plus its ``-atime``) or an orphaned ``-atime``."""

    key: str
    module: str
    name: str  # object name of the -cache file, or of the -atime file for an orphan
    size_bytes: int
    created_s: float  # mtime of the object
    last_used_s: float  # newest of -atime and creation (may already include last_hit_s)
    status: str | None  # "ok" | "corrupt" | None (unknown)
    orphan: bool = False
    version: str | None = None  # the store's version token of `name` (storage.ObjectInfo.version)
    atime_version: str | None = None  # not always known; None = delete -atime unconditionally
    has_atime: bool = False
    # From run records: the newest reported hit, and the jaxlib of the entry's first writer (None: unknown).
    # Hits are the only use an object store's root records (JAX keeps no -atime there), so they make its LRU real.
    last_hit_s: float | None = None
    writer_jaxlib: str | None = None
    # The last integrity verdict (jaxcache.integrity class), when one was made.
    integrity: str | None = None

    @property
    def last_use_s(self) -> float:
        """The newest of the ``-atime``, the last reported hit and creation: what LRU rules compare."""
        return newest_use(self.last_used_s, self.last_hit_s)

    @classmethod
    def from_record(cls, record: Entry | Orphan) -> Candidate:
        """A candidate from a scan record (:class:`jaxcache.scan.Entry` or :class:`jaxcache.scan.Orphan`)."""
        if isinstance(record, Orphan):
            return cls(
                key=record.key, module=record.module, name=record.name, size_bytes=record.size_bytes,
                created_s=record.mtime_s, last_used_s=record.mtime_s, status=None, orphan=True,
                version=record.version,
            )
        return cls(
            key=record.key, module=record.module, name=record.name, size_bytes=record.size_bytes,
            created_s=record.mtime_s, last_used_s=record.last_used_s,
            status=record.status.value if record.status is not None else None,
            version=record.version, has_atime=record.atime_ns is not None,
        )


def newest_use(last_used_s: float, last_hit_s: float | None) -> float:
    """:attr:`Candidate.last_use_s` of a candidate's two fields (one rule, for rows and for columns)."""
    return last_used_s if last_hit_s is None or last_hit_s <= last_used_s else last_hit_s


@dataclass(frozen=True, slots=True)
class Decision:
    """A candidate and why it is deleted (or, in :attr:`PrunePlan.protected`, why it is kept)."""

    candidate: Candidate
    reasons: tuple[str, ...]  # e.g. ("unused for 15d",), ("over max_total_bytes",), ("corrupt",)


class CandidateColumns:
    """Candidates as a table: row ``i`` is :meth:`candidate` ``(i)``, and each column (a list aligned with the rows)
    holds one field of every candidate. What the planner reads.

    Here every column is taken from the candidates, once, when first read; a table that has its columns already (a
    listing's, :mod:`jaxcache.prune.listed`) overrides them and :meth:`candidate`, and then the planner makes no
    object per candidate.
    """

    def __len__(self) -> int:
        raise NotImplementedError

    def candidate(self, row: int) -> Candidate:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Candidate]:
        return map(self.candidate, range(len(self)))

    def key(self, row: int) -> str:
        """Row ``row``'s key, without making the whole column."""
        return self.keys[row]

    @cached_property
    def keys(self) -> list[str]:
        return [c.key for c in self]

    @cached_property
    def modules(self) -> list[str]:
        return [c.module for c in self]

    @cached_property
    def sizes(self) -> Sequence[int]:
        return [c.size_bytes for c in self]

    @cached_property
    def created(self) -> Sequence[float]:
        return [c.created_s for c in self]

    @cached_property
    def last_use(self) -> Sequence[float]:
        """:attr:`Candidate.last_use_s` of each."""
        return [c.last_use_s for c in self]

    @cached_property
    def statuses(self) -> list[str | None]:
        return [c.status for c in self]

    @cached_property
    def integrity(self) -> list[str | None]:
        return [c.integrity for c in self]

    @cached_property
    def writer_jaxlib(self) -> list[str | None]:
        return [c.writer_jaxlib for c in self]

    @cached_property
    def orphan(self) -> list[bool]:
        return [c.orphan for c in self]

    @cached_property
    def entry_rows(self) -> Sequence[int]:
        """The rows that are entries (not orphans), in order."""
        return [i for i, o in enumerate(self.orphan) if not o]

    @cached_property
    def orphan_rows(self) -> Sequence[int]:
        """The rows that are orphaned ``-atime`` files, in order."""
        return [i for i, o in enumerate(self.orphan) if o]


class CandidateList(CandidateColumns):
    """Candidates given one object each (the service's, from its catalog): each column is one pass over them."""

    def __init__(self, candidates: list[Candidate]) -> None:
        self._candidates = candidates

    def __len__(self) -> int:
        return len(self._candidates)

    def candidate(self, row: int) -> Candidate:
        return self._candidates[row]

    def __iter__(self) -> Iterator[Candidate]:
        return iter(self._candidates)

    def key(self, row: int) -> str:
        return self._candidates[row].key


class LruOrder:
    """Rows of a table least recently used first, ties by key, then by row (given in row order): the order of a
    plan's eviction and of its lists. Sorted when first read whole; its first few are found without sorting the rest
    (a dry run's table shows the first 50 of 100k deletions)."""

    __slots__ = ("_ordered", "_rows", "_table")

    def __init__(self, table: CandidateColumns, rows: list[int], *, ordered: bool = False) -> None:
        self._table, self._rows, self._ordered = table, rows, ordered

    def __len__(self) -> int:
        return len(self._rows)

    def all(self) -> list[int]:
        if not self._ordered and len(self._rows) > 1:  # one row or none is in order: no column to make for it
            # Two stable sorts over plain lists (by key, then by last use) allocate no per-row tuples.
            self._rows.sort(key=self._table.keys.__getitem__)
            self._rows.sort(key=self._table.last_use.__getitem__)
            self._ordered = True
        return self._rows

    def first(self, k: int) -> list[int]:
        """The first ``k`` rows, as :meth:`all` orders them."""
        if self._ordered or k >= len(self._rows):
            return self.all()[:k]
        if k <= 0:
            return []
        # Each of the first k was last used at or before the k-th earliest last use: ordering those alone gives them.
        last = self._table.last_use
        bound = heapq.nsmallest(k, map(last.__getitem__, self._rows))[-1]
        few = [row for row in self._rows if last[row] <= bound]
        few.sort(key=self._table.key)
        few.sort(key=last.__getitem__)
        return few[:k]


class Decisions(Sequence[Decision]):
    """Decisions about rows of a table, in :class:`LruOrder`, each made when it is read (and made again if read
    again): a plan holds rows and reasons, not two objects for each of 100k deletions. Equal to any sequence of equal
    decisions (``plan.delete == []``)."""

    __slots__ = ("_make", "_order")

    def __init__(self, order: LruOrder, make: Callable[[int], Decision]) -> None:
        self._order = order
        self._make = make

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, index: int) -> Decision: ...

    @overload
    def __getitem__(self, index: slice) -> list[Decision]: ...

    def __getitem__(self, index: int | slice) -> Decision | list[Decision]:
        if not isinstance(index, slice):
            return self._make(self._order.all()[index])
        if index.start in (None, 0) and index.step in (None, 1) and index.stop is not None and index.stop >= 0:
            rows = self._order.first(index.stop)  # the first few (a table's): the rest need not be ordered
        else:
            rows = self._order.all()[index]
        return [self._make(row) for row in rows]

    def __iter__(self) -> Iterator[Decision]:
        return map(self._make, self._order.all())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    def __repr__(self) -> str:
        return f"Decisions({list(self)!r})"
