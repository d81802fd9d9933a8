"""A root's prune candidates straight from one listing, as columns: what ``jaxcache prune`` plans from when no rule
needs an entry's head (every rule but ``--corrupt``).

A root without JAX's LRU (its default: no ``-atime`` files) costs its listing and a few passes over lists of names and
numbers; a :class:`Candidate` is made only for a decision that is read (a dry run's table shows 50).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property

from jaxcache.prune.candidates import Candidate, CandidateColumns, newest_use
from jaxcache.scan import last_used_s
from jaxcache.scan_indexed import Listing, list_root, pair, read_atimes
from jaxcache.storage.base import Storage


class ListedCandidates(CandidateColumns):
    """The candidates of one listing: its entries (rows ``0 .. entries-1``), then its orphaned ``-atime`` files. Each
    column is made from the listing's tuples when the planner first reads it. Row ``i`` is the candidate
    :meth:`Candidate.from_record` makes of the scan's record, with the run records' hit and writer of its key."""

    def __init__(
        self, names: list[str], sizes: list[int], created: list[float], versions: list[str | None], *,
        entries: int, atime_ns: Mapping[str, int | None], hits: Mapping[str, float], writers: Mapping[str, str],
    ) -> None:
        self._names, self._versions, self._entries = names, versions, entries
        self._atime_ns, self._hits, self._writers = atime_ns, hits, writers
        self.sizes = sizes
        self.created = created

    def __len__(self) -> int:
        return len(self._names)

    def candidate(self, row: int) -> Candidate:
        key = self._names[row][:-6]
        if row >= self._entries:  # an orphan: as Candidate.from_record(Orphan), no hit or writer
            return Candidate(key, key[:-65], self._names[row], self.sizes[row], self.created[row], self.created[row],
                             None, orphan=True, version=self._versions[row])
        return Candidate(key, key[:-65], self._names[row], self.sizes[row], self.created[row],
                         self.last_used[row], None, version=self._versions[row],
                         has_atime=self._atime_ns.get(key) is not None, last_hit_s=self._hits.get(key),
                         writer_jaxlib=self._writers.get(key))

    def key(self, row: int) -> str:
        return self._names[row][:-6]

    @cached_property
    def keys(self) -> list[str]:
        return [name[:-6] for name in self._names]

    @cached_property
    def modules(self) -> list[str]:
        return [name[:-71] for name in self._names]

    @cached_property
    def last_used(self) -> Sequence[float]:
        """Each row's :attr:`Candidate.last_used_s`: the newest of creation and its ``-atime``'s value."""
        if not self._atime_ns:
            return self.created  # no -atime read: last use is creation (JAX's default, without its LRU)
        values, keys = self._atime_ns, self.keys
        return [last_used_s(m, values.get(keys[i])) if i < self._entries else m for i, m in enumerate(self.created)]

    @cached_property
    def last_use(self) -> Sequence[float]:
        if not self._hits:
            return self.last_used
        hits, keys = self._hits, self.keys
        return [newest_use(t, hits.get(keys[i])) if i < self._entries else t for i, t in enumerate(self.last_used)]

    @cached_property
    def statuses(self) -> list[str | None]:
        return [None] * len(self)  # no head is read

    @cached_property
    def integrity(self) -> list[str | None]:
        return [None] * len(self)

    @cached_property
    def writer_jaxlib(self) -> list[str | None]:
        writers, n = self._writers, self._entries
        return [writers.get(k) if i < n else None for i, k in enumerate(self.keys)]

    @cached_property
    def orphan(self) -> list[bool]:
        return [False] * self._entries + [True] * (len(self) - self._entries)

    @cached_property
    def entry_rows(self) -> Sequence[int]:
        return range(self._entries)

    @cached_property
    def orphan_rows(self) -> Sequence[int]:
        return range(self._entries, len(self))


def listed_candidates(
    storage: Storage, *, hits: Mapping[str, float] | None = None, writers: Mapping[str, str] | None = None,
    listed: Listing | None = None,
) -> ListedCandidates:
    """The candidates of ``storage`` from one listing (``listed``, else :func:`list_root`'s): entries paired with
    their ``-atime`` as a scan pairs them (a value is read only where the listing has an ``-atime``), plus orphans.
    ``hits`` and ``writers`` (from run records, by key) fill in last hits and first writers' jaxlib versions."""
    paired = pair(listed or list_root(storage))
    rows = paired.entries + paired.orphans if paired.orphans else paired.entries
    # Four columns in four passes over the tuples: each a list comprehension, cheaper than one loop that appends.
    return ListedCandidates(
        [o[0] for o in rows], [o[1] for o in rows], [o[2] for o in rows], [o[3] for o in rows],
        entries=len(paired.entries), atime_ns=read_atimes(storage, paired), hits=hits or {}, writers=writers or {},
    )
