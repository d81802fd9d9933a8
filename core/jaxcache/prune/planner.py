"""The planner: candidates and a policy in, a plan out. Pure: it reads and deletes nothing, so the CLI (from a
scan) and the service (from its catalog) plan the same way."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from jaxcache.prune.candidates import Candidate, CandidateColumns, CandidateList, Decision, Decisions, LruOrder
from jaxcache.prune.policy import PrunePolicy
from jaxcache.units import format_duration

OVER_MAX_TOTAL = "over max_total_bytes"
ORPHAN_REASON = "orphaned -atime file"
CORRUPT_REASON = "corrupt"

@dataclass(slots=True)
class PrunePlan:
    """What a policy deletes. ``delete`` is ordered least recently used first (the order :func:`apply` takes)."""

    delete: list[Decision] | Decisions
    protected: list[Decision] | Decisions  # selected by a rule but kept; reasons say why ("pinned by 'jit_train*'")
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
    candidates: Iterable[Candidate] | CandidateColumns, policy: PrunePolicy, *, now: float,
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
    # Column by column: each rule reads one field of every entry and picks rows; reasons and decisions are made
    # only for the rows someone reads (plan.delete is lazy), so a table of columns costs no object per candidate.
    t = candidates if isinstance(candidates, CandidateColumns) else CandidateList(list(candidates))
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
    pins = _Globs(policy.keep)
    min_age = policy.min_age_s
    grace = (f"younger than min_age {format_duration(min_age)}",)
    pin_reason = {p: f"pinned by {p!r}" for p in policy.keep}

    def protection(i: int) -> tuple[str, ...]:
        why: tuple[str, ...] = ()
        if pins.patterns:
            by_key, by_module = pins.matching(t.keys[i]), pins.matching_cached(t.modules[i])
            if by_key or by_module:
                matched = set(by_key).union(by_module)
                why = tuple(pin_reason[p] for p in pins.patterns if p in matched)
        return why + grace if now - t.created[i] < min_age else why

    # Each selecting rule: the rows it picks (in row order) and its reason for one of them.
    rules = _rules(t, policy, now, current)
    if len(rules) == 1:
        picked = rules[0][0]
        only = rules[0][1]

        def reasons(i: int) -> tuple[str, ...]:
            return (only(i),)
    else:
        picks = [(set(rows), why) for rows, why in rules]
        picked = sorted(set[int]().union(*(rows for rows, _ in picks)))

        def reasons(i: int) -> tuple[str, ...]:
            return tuple(why(i) for rows, why in picks if i in rows)

    sizes = t.sizes
    total = sum(sizes)
    # Protected rows and why, in row order: pins, and the grace period of what was created less than min_age ago.
    if pins.patterns:
        guarded = {i: why for i in picked if (why := protection(i))}
    else:
        created = t.created
        guarded = {i: grace for i in picked if now - created[i] < min_age}
    deleting = [i for i in picked if i not in guarded] if guarded else picked
    freed = sum([sizes[i] for i in deleting])

    # One order serves the eviction walk and both lists: least recently used first, ties by key. Without an
    # eviction only the lists' own rows are ordered, and only as far as they are read.
    evicted: set[int] = set()
    limit = policy.max_total_bytes
    if limit is not None and total - freed > limit:
        order = LruOrder(t, list(range(len(t)))).all()
        chosen = set(deleting)
        orphan = t.orphan
        for i in order:
            if total - freed <= limit:
                break
            if orphan[i] or i in chosen or i in guarded:
                continue
            why = protection(i)
            if why:
                guarded[i] = why
            else:
                chosen.add(i)
                evicted.add(i)
                freed += sizes[i]
        delete_rows = LruOrder(t, [i for i in order if i in chosen], ordered=True)
        protected_rows = LruOrder(t, [i for i in order if i in guarded], ordered=True)
    else:
        delete_rows = LruOrder(t, deleting)
        protected_rows = LruOrder(t, list(guarded))

    def deleted(i: int) -> Decision:
        return Decision(t.candidate(i), (OVER_MAX_TOTAL,) if i in evicted else reasons(i))

    def kept_back(i: int) -> Decision:
        return Decision(t.candidate(i), guarded[i])

    return PrunePlan(
        delete=Decisions(delete_rows, deleted),
        protected=Decisions(protected_rows, kept_back),
        kept=len(t) - len(delete_rows) - len(protected_rows),
        bytes_freed=freed,
        bytes_remaining=total - freed,
        entries_total=len(t),
        notes=notes,
    )


Rule = tuple[list[int], Callable[[int], str]]


def _rules(t: CandidateColumns, policy: PrunePolicy, now: float, current: frozenset[str] | None) -> list[Rule]:
    """The rows each selecting rule of ``policy`` picks, in rule order (the order of a decision's reasons), each
    with its reason for a row. Orphans are picked by ``orphans`` only."""
    ages: dict[int, str] = {}

    def age(seconds: float) -> str:
        # format_duration works in whole seconds; entries written in a burst share them: format each once.
        s = int(seconds) if seconds > 0 else 0
        text = ages.get(s)
        if text is None:
            text = ages[s] = format_duration(s)
        return text

    rules: list[Rule] = []
    entries = t.entry_rows
    if (unused_for := policy.unused_for_s) is not None:
        last = t.last_use
        rules.append(([i for i in entries if now - last[i] >= unused_for],
                      lambda i: f"unused for {age(now - last[i])}"))
    if (older_than := policy.older_than_s) is not None:
        created = t.created
        rules.append(([i for i in entries if now - created[i] >= older_than],
                      lambda i: f"created {age(now - created[i])} ago"))
    if policy.functions:
        functions, modules = _Globs(policy.functions), t.modules
        function_reason = {p: f"function matches {p!r}" for p in policy.functions}
        rules.append(([i for i in entries if functions.matching_cached(modules[i])],
                      lambda i: function_reason[functions.matching_cached(modules[i])[0]]))
    if policy.corrupt:
        statuses = t.statuses
        rules.append(([i for i in entries if statuses[i] == "corrupt"], lambda i: CORRUPT_REASON))
    if policy.integrity:
        classes, verdicts = frozenset(policy.integrity), t.integrity
        rules.append(([i for i in entries if verdicts[i] is not None and verdicts[i] in classes],
                      lambda i: f"integrity: {verdicts[i]}"))
    if current is not None:
        writers = t.writer_jaxlib
        window = format_duration(policy.stale_jaxlib_window_s)
        rules.append(([i for i in entries if (w := writers[i]) is not None and w not in current],
                      lambda i: f"written by jaxlib {writers[i]}, which no run used in the last {window}"))
    if policy.orphans:
        rules.append((list(t.orphan_rows), lambda i: ORPHAN_REASON))
    return rules

