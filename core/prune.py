"""Prune a cache root: a pure policy (candidates in, plan out) and an executor that deletes the plan.

:func:`plan` never touches storage: it takes :class:`Candidate` records (from a scan, or from the service's
catalog) and a :class:`PrunePolicy`, and says what to delete and why. :func:`apply` deletes a plan's entries,
each ``-cache`` before its ``-atime`` (JAX treats a missing ``-cache`` as a miss; a lone ``-atime`` is harmless),
with the generation the listing saw as a GCS precondition, so an object replaced since the listing is left alone.

Deleting entries while jobs run is safe for them: JAX turns a read error into a warning and recompiles
(DESIGN.md §1). On a local root where JAX's own LRU is on (a ``.lockfile`` exists), each deletion also takes
JAX's lock, so JAX's eviction never trips over an entry half deleted.

Re-running :func:`apply` on the same plan after a crash ends in the same state as one clean run: a missing object
counts as already gone and the rest is deleted. A fresh scan and plan after a crash converge too, except that a
crash *between* an entry's two deletes leaves its ``-atime`` as an orphan (8 bytes, harmless to JAX), which only
``orphans=True`` removes.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import math
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from jaxcache import entry as fmt
from jaxcache.errors import InvalidInputError, PreconditionFailedError, StorageError
from jaxcache.parallel import bounded_map
from jaxcache.scan import Entry, Orphan
from jaxcache.storage.base import Storage
from jaxcache.storage.local import LocalStorage
from jaxcache.units import format_duration, parse_bytes, parse_duration

OVER_MAX_TOTAL = "over max_total_bytes"
STALE_JAXLIB_WINDOW_S = 14 * 86400.0
ORPHAN_REASON = "orphaned -atime file"
CORRUPT_REASON = "corrupt"

# --------------------------------------------------------------------------------------------------------------
# Policy


@dataclass(frozen=True, slots=True)
class PrunePolicy:
    """What to delete. An entry goes if ANY selecting rule picks it and NO keep rule (pins, min_age) protects it.

    Selecting rules: ``max_total_bytes``, ``unused_for_s``, ``older_than_s``, ``functions``, ``corrupt``,
    ``orphans``, ``stale_jaxlib``. Keep rules: ``keep`` (pins) and ``min_age_s`` (a grace period for fresh entries).
    """

    max_total_bytes: int | None = None  # evict least recently used first until total <= this
    unused_for_s: float | None = None  # last use older than this
    older_than_s: float | None = None  # created longer ago than this
    functions: tuple[str, ...] = ()  # fnmatch globs over the function (module) name
    corrupt: bool = False  # entries whose status is "corrupt"
    orphans: bool = False  # orphaned -atime files
    keep: tuple[str, ...] = ()  # pins: exact keys or fnmatch globs over key OR function name
    min_age_s: float = 3600.0  # grace: never delete anything created (mtime) less than this ago
    # Entries whose writer's jaxlib no run used within the window: a jaxlib upgrade changes every key, so they can
    # never hit again. Needs run records (plan's ``recent_jaxlibs``); an entry with an unknown writer is never stale.
    stale_jaxlib: bool = False
    stale_jaxlib_window_s: float = STALE_JAXLIB_WINDOW_S
    # Integrity classes to remove ("tampered", "corrupt", "mismatched"): needs verdicts (Candidate.integrity).
    integrity: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # The service may build a policy directly: check it here too, not only in policy_from_mapping.
        if self.max_total_bytes is not None:
            _check_number("max_total_bytes", self.max_total_bytes, integer=True)
        for name in ("unused_for_s", "older_than_s"):
            value = getattr(self, name)
            if value is not None:
                _check_number(name, value)
        _check_number("min_age_s", self.min_age_s)
        _check_number("stale_jaxlib_window_s", self.stale_jaxlib_window_s)
        for name in ("functions", "keep"):
            object.__setattr__(self, name, _check_patterns(name, getattr(self, name)))
        for name in ("corrupt", "orphans", "stale_jaxlib"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInputError(f"prune policy {name} must be true or false, not {getattr(self, name)!r}")
        object.__setattr__(self, "integrity", _check_integrity(self.integrity))

    def selects_anything(self) -> bool:
        """False when no selecting rule is set (such a policy deletes nothing)."""
        return (
            self.max_total_bytes is not None
            or self.unused_for_s is not None
            or self.older_than_s is not None
            or bool(self.functions)
            or self.corrupt
            or self.orphans
            or self.stale_jaxlib
            or bool(self.integrity)
        )

    def as_dict(self) -> dict[str, Any]:
        """The policy with the field names of :func:`policy_from_mapping`, durations in seconds (for JSON)."""
        return {
            "max_total_bytes": self.max_total_bytes,
            "unused_for": self.unused_for_s,
            "older_than": self.older_than_s,
            "functions": list(self.functions),
            "corrupt": self.corrupt,
            "orphans": self.orphans,
            "keep": list(self.keep),
            "min_age": self.min_age_s,
            "stale_jaxlib": self.stale_jaxlib,
            "stale_jaxlib_window": self.stale_jaxlib_window_s,
            "integrity": list(self.integrity),
        }


INTEGRITY_CLASSES = ("tampered", "mismatched", "corrupt")


def _check_integrity(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise InvalidInputError(f"prune policy integrity must be a list of classes, not {value!r}")
    bad = [v for v in value if v not in INTEGRITY_CLASSES]
    if bad:
        raise InvalidInputError(
            f"prune policy integrity: {', '.join(map(repr, bad))} cannot be selected; use any of "
            f"{', '.join(INTEGRITY_CLASSES)} (pending and unattested entries are not evidence of harm)"
        )
    return tuple(dict.fromkeys(value))


def _check_number(name: str, value: Any, *, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        what = "a whole number of bytes" if integer else "a number of seconds"
        raise InvalidInputError(f"prune policy {name} must be {what}, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"prune policy {name} must be 0 or more, not {value!r}")


def _check_patterns(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise InvalidInputError(f"prune policy {name} must be a list of patterns (strings), not {value!r}")
    if any(not p.strip() for p in value):
        raise InvalidInputError(f"prune policy {name} has an empty pattern: remove it or give a glob like 'jit_train*'")
    return tuple(dict.fromkeys(value))  # in order, without repeats


_FIELDS = (
    "max_total_bytes", "unused_for", "older_than", "functions", "corrupt", "orphans", "keep", "min_age",
    "stale_jaxlib", "stale_jaxlib_window", "integrity",
)


def policy_from_mapping(data: Mapping[str, Any]) -> PrunePolicy:
    """Build a policy from user input (JSON, YAML, a form), rejecting anything it does not understand.

    Fields: ``max_total_bytes`` (bytes or a size like ``"50GiB"``), ``unused_for``, ``older_than`` and
    ``min_age`` (seconds or a duration like ``"14d"``), ``functions`` and ``keep`` (lists of globs; a single
    string is one glob), ``corrupt``, ``orphans`` and ``stale_jaxlib`` (booleans), ``stale_jaxlib_window`` (a
    duration, default 14d; only with ``stale_jaxlib``). Absent or null fields take their defaults.
    An unknown field is an error: a typo in a prune policy must not silently widen it.
    """
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"a prune policy must be a mapping of fields to values, not {type(data).__name__}")
    for key in data:
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), _FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidInputError(
                f"unknown prune policy field {key!r}{hint}; known fields: {', '.join(_FIELDS)}"
            )
    kwargs: dict[str, Any] = {}
    if data.get("max_total_bytes") is not None:
        kwargs["max_total_bytes"] = _size("max_total_bytes", data["max_total_bytes"])
    durations = (("unused_for", "unused_for_s"), ("older_than", "older_than_s"), ("min_age", "min_age_s"),
                 ("stale_jaxlib_window", "stale_jaxlib_window_s"))
    for key, attr in durations:
        if data.get(key) is not None:
            kwargs[attr] = _duration(key, data[key])
    for key in ("functions", "keep", "integrity"):
        if data.get(key) is not None:
            kwargs[key] = data[key]
    for key in ("corrupt", "orphans", "stale_jaxlib"):
        if data.get(key) is not None:
            if not isinstance(data[key], bool):
                raise InvalidInputError(f"prune policy field {key!r} must be true or false, not {data[key]!r}")
            kwargs[key] = data[key]
    if "stale_jaxlib_window_s" in kwargs and not kwargs.get("stale_jaxlib"):
        # A window alone selects nothing: most likely `stale_jaxlib: true` was forgotten.
        raise InvalidInputError("prune policy field 'stale_jaxlib_window' needs 'stale_jaxlib': true")
    return PrunePolicy(**kwargs)


def _size(key: str, value: Any) -> int:
    if isinstance(value, str):
        try:
            return parse_bytes(value)
        except InvalidInputError as exc:
            raise InvalidInputError(f"prune policy field {key!r}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(
            f"prune policy field {key!r} must be a whole number of bytes or a size like '50GiB', not {value!r}"
        )
    if value < 0:
        raise InvalidInputError(f"prune policy field {key!r} must be 0 or more, not {value}")
    return value


def _duration(key: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except InvalidInputError as exc:
            raise InvalidInputError(f"prune policy field {key!r}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(
            f"prune policy field {key!r} must be seconds or a duration like '14d', not {value!r}"
        )
    if not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"prune policy field {key!r} must be 0 or more seconds, not {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------------------------------
# Candidates and the plan


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


# --------------------------------------------------------------------------------------------------------------
# The executor


@dataclass(slots=True)
class PruneResult:
    """What :func:`apply` did."""

    deleted: int = 0
    bytes_freed: int = 0
    already_gone: int = 0
    changed: int = 0  # precondition failed: the object was replaced since the listing; left alone
    errors: list[str] = field(default_factory=list)


_DELETED, _GONE, _CHANGED, _FAILED = "deleted", "gone", "changed", "failed"


class _JaxLruLock:
    """JAX's own LRU lock: an exclusive ``flock`` on ``<root>/.lockfile``, which JAX (through ``filelock``) takes
    around every cache read and write when ``jax_compilation_cache_max_size`` is set.

    Held around each entry's two deletions, so JAX's eviction, which lists ``-cache`` files and then reads each
    one's ``-atime``, never sees an entry half deleted (it would fail that write and every later one). One file
    descriptor for the whole run keeps this to two system calls per entry. If the lock cannot be had within
    ``timeout_s`` (a stuck holder), deletion goes on without it for the rest of the run: still safe for jobs,
    which turn read errors into warnings.
    """

    def __init__(self, fd: int, timeout_s: float = 10.0) -> None:
        import fcntl

        self._fd = fd
        self._flock = fcntl.flock
        self._ex, self._nb, self._un = fcntl.LOCK_EX, fcntl.LOCK_NB, fcntl.LOCK_UN
        self._timeout_s = timeout_s
        # flock belongs to the open file, not the thread: our own threads take turns.
        self._mutex = threading.Lock()
        self._usable = True

    def _acquire(self) -> bool:
        deadline = time.monotonic() + self._timeout_s
        delay = 0.001
        while True:
            try:
                self._flock(self._fd, self._ex | self._nb)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._usable = False
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            except OSError:
                self._usable = False
                return False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._mutex:
            locked = self._usable and self._acquire()
            try:
                yield
            finally:
                if locked:
                    self._flock(self._fd, self._un)


@contextlib.contextmanager
def _lock_for(storage: Storage) -> Iterator[Callable[[], contextlib.AbstractContextManager[None]]]:
    """JAX's LRU lock on a local root where JAX's LRU is on (a ``.lockfile`` exists); a no-op elsewhere."""
    fd = -1
    if isinstance(storage, LocalStorage):
        try:
            import fcntl  # noqa: F401  (POSIX only)

            fd = os.open(os.path.join(storage.root, ".lockfile"), os.O_RDONLY)
        except (ImportError, OSError):
            fd = -1
    if fd < 0:
        yield contextlib.nullcontext
        return
    try:
        yield _JaxLruLock(fd)
    finally:
        os.close(fd)


def _delete_one(
    storage: Storage, lock: Callable[[], contextlib.AbstractContextManager[None]], jax_lru: bool, decision: Decision
) -> tuple[Decision, str, str | None]:
    c = decision.candidate
    try:
        with lock():
            if c.orphan and c.generation is None and storage.exists(fmt.cache_name(c.key)):
                # The entry came back since the listing (a job wrote the key again): this -atime is its own.
                # Deleting it would leave a -cache without -atime, which breaks every write of JAX's LRU.
                return decision, _CHANGED, None
            present = storage.delete(c.name, if_generation=c.generation)
            # Where JAX's LRU is on every entry gets an -atime, possibly just after the listing looked: try anyway.
            if c.orphan or not (c.has_atime or jax_lru):
                return decision, _DELETED if present else _GONE, None
            try:
                storage.delete(fmt.atime_name(c.key), if_generation=c.atime_generation)
            except PreconditionFailedError:
                pass  # a job wrote this key again since the listing: the -atime is the new entry's
            except StorageError as exc:
                return decision, _DELETED if present else _GONE, f"{c.key}: deleted the entry but not its -atime: {exc}"
    except PreconditionFailedError:
        return decision, _CHANGED, None
    except StorageError as exc:
        return decision, _FAILED, str(exc)
    return decision, _DELETED if present else _GONE, None


def apply(
    storage: Storage,
    plan: PrunePlan,
    *,
    on_deleted: Callable[[Decision], None] | None = None,
    workers: int | None = None,
) -> PruneResult:
    """Delete what ``plan`` says, in its order; return counts. Keeps going past per-object failures.

    Each entry's ``-cache`` goes before its ``-atime``, with ``if_generation`` from the listing (GCS): an object
    replaced since then counts as ``changed`` and is left alone; a missing one counts as ``already_gone``.
    ``on_deleted`` runs in the calling thread, in plan order, once per decision whose entry is gone afterwards
    (deleted now or already gone). ``workers`` defaults to the backend's ``io_workers`` (1 on a directory,
    16 on GCS). Idempotent: applying the same plan again after a crash ends in the same state as one clean run.
    """
    if workers is None:
        workers = storage.io_workers
    result = PruneResult()
    with _lock_for(storage) as lock:
        work = partial(_delete_one, storage, lock, lock is not contextlib.nullcontext)
        for decision, outcome, error in bounded_map(work, plan.delete, workers=workers):
            if outcome == _DELETED:
                result.deleted += 1
                result.bytes_freed += decision.candidate.size_bytes
            elif outcome == _GONE:
                result.already_gone += 1
            elif outcome == _CHANGED:
                result.changed += 1
            if error is not None:
                result.errors.append(error)
            if on_deleted is not None and outcome in (_DELETED, _GONE):
                on_deleted(decision)
    return result
