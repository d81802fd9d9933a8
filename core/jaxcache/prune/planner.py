"""The planner: candidates and a policy in, a plan out. Pure: it reads and deletes nothing, so the CLI (from a
scan) and the service (from its catalog) plan the same way."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from jaxcache.prune.policy import PrunePolicy
from jaxcache.scan import Entry, Orphan
from jaxcache.units import format_duration

OVER_MAX_TOTAL = "over max_total_bytes"
ORPHAN_REASON = "orphaned -atime file"
CORRUPT_REASON = "corrupt"

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
    generation: int | None = None  # GCS generation of `name`
    atime_generation: int | None = None  # not always known; None = delete -atime unconditionally
    has_atime: bool = False
    # From run records: the newest reported hit, and the jaxlib of the entry's first writer (None: unknown).
    # Hits are the only use a GCS root records (JAX keeps no -atime there), so they make its LRU real.
    last_hit_s: float | None = None
    writer_jaxlib: str | None = None
    # The last integrity verdict (jaxcache.integrity class), when one was made.
    integrity: str | None = None

    @property
    def last_use_s(self) -> float:
        """The newest of the ``-atime``, the last reported hit and creation: what LRU rules compare."""
        hit = self.last_hit_s
        return self.last_used_s if hit is None or hit <= self.last_used_s else hit

    @classmethod
    def from_record(cls, record: Entry | Orphan) -> Candidate:
        """A candidate from a scan record (:class:`jaxcache.scan.Entry` or :class:`jaxcache.scan.Orphan`)."""
        if isinstance(record, Orphan):
            return cls(
                key=record.key, module=record.module, name=record.name, size_bytes=record.size_bytes,
                created_s=record.mtime_s, last_used_s=record.mtime_s, status=None, orphan=True,
                generation=record.generation,
            )
        return cls(
            key=record.key, module=record.module, name=record.name, size_bytes=record.size_bytes,
            created_s=record.mtime_s, last_used_s=record.last_used_s,
            status=record.status.value if record.status is not None else None,
            generation=record.generation, has_atime=record.atime_ns is not None,
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """A candidate and why it is deleted (or, in :attr:`PrunePlan.protected`, why it is kept)."""

    candidate: Candidate
    reasons: tuple[str, ...]  # e.g. ("unused for 15d",), ("over max_total_bytes",), ("corrupt",)


@dataclass(slots=True)
class PrunePlan:
    """What a policy deletes. ``delete`` is ordered least recently used first (the order :func:`apply` takes)."""

    delete: list[Decision]
    protected: list[Decision]  # selected by a rule but kept; reasons say why ("pinned by 'jit_train*'", ...)
    kept: int  # candidates no rule selected
    bytes_freed: int
    bytes_remaining: int
    entries_total: int
    notes: list[str] = field(default_factory=list)  # what the policy could not do, and why ("no runs seen ...")


class _Globs:
    """fnmatch globs compiled once; which of them match a name (first match, or all), fast for many names."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        self._each = [(p, re.compile(fnmatch.translate(p)).match) for p in self.patterns]
        # One alternation answers "does anything match?" in a single regex call: most names match nothing.
        self._any = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in self.patterns)).match
        self._by_name: dict[str, tuple[str, ...]] = {}

    def matching(self, name: str) -> tuple[str, ...]:
        """The patterns that match ``name``, in policy order."""
        if not self.patterns or not self._any(name):
            return ()
        return tuple(p for p, match in self._each if match(name))

    def matching_cached(self, name: str) -> tuple[str, ...]:
        """:meth:`matching` for names that repeat (function names): each is matched once."""
        found = self._by_name.get(name)
        if found is None:
            found = self._by_name[name] = self.matching(name)
        return found


def plan(
    candidates: Iterable[Candidate], policy: PrunePolicy, *, now: float,
    recent_jaxlibs: Collection[str] | None = None,
) -> PrunePlan:
    """Decide what ``policy`` deletes among ``candidates`` at time ``now`` (seconds since the epoch).

    Pure: reads nothing, deletes nothing. Last use is :attr:`Candidate.last_use_s` (the newest of ``-atime``,
    last reported hit and creation). ``max_total_bytes`` counts every candidate toward the total (protected
    ones and orphans too), treats entries picked by other rules as freed first, then evicts the least recently
    used unprotected entries (ties by key) until the total is at or below the limit. A protected entry the
    eviction had to pass over is listed in ``protected``. Both lists come least recently used first.

    ``recent_jaxlibs`` are the jaxlib versions of runs updated within ``policy.stale_jaxlib_window_s`` (the
    caller reads run records). ``stale_jaxlib`` selects entries whose writer's jaxlib is not among them; when it
    is None or empty (no runs seen: nothing says which versions are current) the rule selects nothing and
    :attr:`PrunePlan.notes` says so.
    """
    cands = candidates if isinstance(candidates, list) else list(candidates)
    notes: list[str] = []
    current: frozenset[str] | None = None
    if policy.stale_jaxlib:
        if recent_jaxlibs:
            current = frozenset(recent_jaxlibs)
        else:
            notes.append(
                f"stale_jaxlib selected nothing: no run records from the last "
                f"{format_duration(policy.stale_jaxlib_window_s)}, so which jaxlib versions are in use is unknown"
            )
    stale_reason: dict[str, str] = {}
    functions = _Globs(policy.functions)
    pins = _Globs(policy.keep)
    unused_for, older_than, min_age = policy.unused_for_s, policy.older_than_s, policy.min_age_s
    grace = f"younger than min_age {format_duration(min_age)}"
    function_reason = {p: f"function matches {p!r}" for p in policy.functions}
    pin_reason = {p: f"pinned by {p!r}" for p in policy.keep}

    def protection(c: Candidate) -> tuple[str, ...]:
        by_key, by_module = pins.matching(c.key), pins.matching_cached(c.module)
        if by_key or by_module:
            matched = set(by_key).union(by_module)
            why = tuple(pin_reason[p] for p in pins.patterns if p in matched)
        else:
            why = ()
        return why + (grace,) if now - c.created_s < min_age else why

    ages: dict[int, str] = {}

    def age(seconds: float) -> str:
        # format_duration works in whole seconds; entries written in a burst share them: format each once.
        s = int(seconds) if seconds > 0 else 0
        text = ages.get(s)
        if text is None:
            text = ages[s] = format_duration(s)
        return text

    delete: dict[int, tuple[str, ...]] = {}
    protected: dict[int, tuple[str, ...]] = {}
    total = 0
    freed = 0
    select_orphans, select_corrupt = policy.orphans, policy.corrupt
    integrity_classes = frozenset(policy.integrity)
    for i, c in enumerate(cands):
        total += c.size_bytes
        if c.orphan:
            if not select_orphans:
                continue
            reasons = [ORPHAN_REASON]
        else:
            reasons = []
            if unused_for is not None:
                last_use = c.last_use_s
                if now - last_use >= unused_for:
                    reasons.append(f"unused for {age(now - last_use)}")
            if older_than is not None and now - c.created_s >= older_than:
                reasons.append(f"created {age(now - c.created_s)} ago")
            if functions.patterns:
                matched = functions.matching_cached(c.module)
                if matched:
                    reasons.append(function_reason[matched[0]])
            if select_corrupt and c.status == "corrupt":
                reasons.append(CORRUPT_REASON)
            if c.integrity is not None and c.integrity in integrity_classes:
                reasons.append(f"integrity: {c.integrity}")
            if current is not None and c.writer_jaxlib is not None and c.writer_jaxlib not in current:
                why_stale = stale_reason.get(c.writer_jaxlib)
                if why_stale is None:
                    why_stale = stale_reason[c.writer_jaxlib] = (
                        f"written by jaxlib {c.writer_jaxlib}, which no run used in the last "
                        f"{format_duration(policy.stale_jaxlib_window_s)}"
                    )
                reasons.append(why_stale)
            if not reasons:
                continue
        why = protection(c) if pins.patterns or now - c.created_s < min_age else ()
        if why:
            protected[i] = why
        else:
            delete[i] = tuple(reasons)
            freed += c.size_bytes

    # One order serves the eviction walk and both lists: least recently used first, ties by key. Two stable sorts
    # over plain lists (by key, then by last use) allocate no per-candidate tuples.
    order = sorted(range(len(cands)), key=[c.key for c in cands].__getitem__)
    order.sort(key=[c.last_use_s for c in cands].__getitem__)
    limit = policy.max_total_bytes
    if limit is not None and total - freed > limit:
        for i in order:
            if total - freed <= limit:
                break
            c = cands[i]
            if c.orphan or i in delete or i in protected:
                continue
            why = protection(c)
            if why:
                protected[i] = why
            else:
                delete[i] = (OVER_MAX_TOTAL,)
                freed += c.size_bytes

    return PrunePlan(
        delete=[Decision(cands[i], delete[i]) for i in order if i in delete],
        protected=[Decision(cands[i], protected[i]) for i in order if i in protected],
        kept=len(cands) - len(delete) - len(protected),
        bytes_freed=freed,
        bytes_remaining=total - freed,
        entries_total=len(cands),
        notes=notes,
    )
