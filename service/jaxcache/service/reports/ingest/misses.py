"""Misses explained as records are folded: each run's miss of a key gets :func:`jaxcache.explain.explain`'s cause,
difference, nearest key and fix on its usage row, from a history read in a few bounded reads per batch of misses."""

from __future__ import annotations

import functools
from collections import Counter, defaultdict, namedtuple
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from sqlalchemy import Select, Text, Update, and_, bindparam, cast, select, update
from sqlalchemy.engine import Connection

from jaxcache import integrity
from jaxcache.explain import Deletion, EntryNow, Explanation, Known, explain
from jaxcache.explain.from_root import LIBRARY
from jaxcache.keyparts import KeyParts, ProgramSignature
from jaxcache.records import JOB, Fingerprint
from jaxcache.service.catalog.models import (
    RUNNING,
    CacheRow,
    EntryRow,
    PruneItemRow,
    PruneRow,
    RunRow,
    UsageRow,
    VerificationRow,
    WarmupKeyRow,
    WarmupRow,
    table_of,
)
from jaxcache.service.catalog.usage import is_miss
from jaxcache.service.reports.ingest.usage import EXPLANATION

#: Newest rows read per missed key: enough to hold other processes' latest write, hit and compile.
KEY_ROWS = 200
#: Rows with parts per function, capped per key so one busy key does not hide the others from the nearest-key search.
FUNCTION_KEYS, ROWS_PER_KEY = 8, 16
#: The function's oldest rows, whatever their parts: whether the cache had seen the function at all (new_program).
FIRST_ROWS = 4
#: Entries read per function, oldest first (as many as the CLI reads of a root).
FUNCTION_ENTRIES = 3
WARMUP_ROWS = 1000
#: Misses of one key or function this close in time share one read of the rows before the last of them.
BUCKET_S = 3600.0
#: Misses explained together over one history read: a job's processes miss the same keys and share usage rows.
BATCH_KEYS, BATCH = 1000, 20_000
#: What a stored explanation keeps at most: a program's signature or a run's flags can be long, the API pages are not.
_CHANGES, _TEXT = 50, 2000

T = TypeVar("T")
_u, _r = UsageRow, RunRow


def _text(column: Any) -> Any:
    # JSON as its text on both drivers (psycopg would decode it): decoded here once per distinct value.
    return cast(column, Text).label(column.key)


_USAGE = (_u.key, _u.function, _u.event, _u.first_at, _u.job, _u.run_id, _u.process_index, _u.kind, _text(_u.parts),
          _text(_u.program), _u.reason, _u.compile_s, _r.started_s, _text(_r.fingerprint), _r.topology)
UsageKnown = namedtuple("UsageKnown", [str(c.key) for c in _USAGE])  # type: ignore[misc]
_EVENTS = {"written": "write", "present": "hit", "not_written": "compiled"}


def decoded(value: Any, kind: type[T]) -> T | None:
    """A JSON column's value as ``kind`` (its text, or what a driver decoded); None when it is not one."""
    if value is None:
        return None
    try:
        if isinstance(value, (str, bytes)):
            return msgspec.json.decode(value, type=kind)
        return msgspec.convert(value, kind)
    except (msgspec.ValidationError, msgspec.DecodeError):  # another version's format: not evidence this one reads
        return None


class Decoder(dict[tuple[type, str], Any]):
    """JSON texts decoded once each: most rows repeat their key's and run's."""

    def __call__(self, text: str | None, kind: type[T]) -> T | None:
        if text is not None and (kind, text) not in self:
            self[kind, text] = decoded(text, kind)
        return None if text is None else self[kind, text]


# Statements built once per shape with bound values: building expressions is most of a small query's cost.
def _usage_base() -> Select:
    return (select(*_USAGE).join(_r, and_(_r.cache == _u.cache, _r.run_id == _u.run_id,
                                          _r.process_index == _u.process_index))
            .where(_u.cache == bindparam("cache")))


@functools.cache
def _of_key() -> Select:
    return (_usage_base().where(_u.key == bindparam("key"), _u.first_at < bindparam("until"))
            .order_by(_u.first_at.desc()).limit(bindparam("limit")))


@functools.cache
def _of_function(seen: int) -> Select:
    """The newest rows with parts of a function, but those of the ``seen`` keys bound as x0, x1, ..."""
    return (_usage_base().where(_u.function == bindparam("function"), _u.first_at < bindparam("until"),
                                _u.parts.is_not(None), *(_u.key != bindparam(f"x{i}") for i in range(seen)))
            .order_by(_u.first_at.desc()).limit(bindparam("limit")))


@functools.cache
def _first_of_function() -> Select:
    return _usage_base().where(_u.function == bindparam("function")).order_by(_u.first_at).limit(bindparam("limit"))


@functools.cache
def _stored() -> Select:
    # A job's miss only: a row may have changed since it was listed to explain (a run id used again).
    return (_usage_base().add_columns(_u.missed, _u.counted)
            .where(_u.run_id == bindparam("run_id"), _u.cause.is_(None), is_miss(_u.kind, _u.event)))


@functools.cache
def _warmups_of(column: str) -> Select:
    w, wr = WarmupKeyRow, WarmupRow
    return (select(w.key, w.function, w.status, w.reason, _text(w.parts), _text(w.program), w.compile_s, wr.id,
                   wr.job, wr.started_s, _text(wr.fingerprint), wr.topology)
            .join(wr, and_(wr.cache == w.cache, wr.id == w.warmup_id))
            .where(w.cache == bindparam("cache"), getattr(w, column) == bindparam("value"),
                   wr.started_s < bindparam("until"))
            .order_by(wr.started_s.desc()).limit(bindparam("limit")))


@functools.cache
def _entry() -> Select:
    e, v = EntryRow, VerificationRow
    return (select(e.key, e.created_s, e.size_bytes, e.compression, e.status, e.reason, v.classification,
                   _text(v.reasons), v.size_bytes, v.created_s)
            .outerjoin(v, and_(v.cache == e.cache, v.key == e.key))
            .where(e.cache == bindparam("cache"), e.kind == "entry", e.key == bindparam("key")))


@functools.cache
def _entries_of_function() -> Select:
    e = EntryRow
    return (select(e.key, e.created_s, e.compression)
            .where(e.cache == bindparam("cache"), e.kind == "entry", e.module == bindparam("function"))
            .order_by(e.created_s, e.key).limit(bindparam("limit")))


@functools.cache
def _deletions() -> Select:
    i, p = PruneItemRow, PruneRow
    return (select(p.id, p.at_s, p.who, _text(p.policy), p.kind).select_from(i).join(p, p.id == i.prune_id)
            .where(p.cache == bindparam("cache"), i.key == bindparam("key"), p.state != RUNNING,
                   ~i.name.like("%-atime")))


def stored_misses(conn: Connection, cache: str, rows: Iterable[tuple[str, str, str]]) -> list[tuple[Known, int, int]]:
    """Unexplained misses at (run id, job, key) as the engine's, with their missed and counted numbers, oldest first."""
    decode = Decoder()
    wanted: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for run_id, job, key in rows:
        wanted[run_id].add((job, key))
    # One read per run, not per row: a report has dozens.
    out = [(known_of_usage(UsageKnown(*r[:-2]), decode), r[-2], r[-1]) for run_id, keys in wanted.items()
           for r in conn.execute(_stored(), {"cache": cache, "run_id": run_id})
           if (r[4], r[0]) in keys]
    return sorted(out, key=lambda m: (m[0].at, m[0].run_id or "", m[0].process_index, m[0].key))


class CatalogHistory:
    """What the catalog knows about the keys and functions of ``misses``, read once."""

    def __init__(self, conn: Connection, cache: str, misses: Sequence[Known]) -> None:
        self._conn, self._cache = conn, cache
        self._decode = Decoder()
        by_key: dict[str, list[float]] = defaultdict(list)
        by_function: dict[str, list[float]] = defaultdict(list)
        for m in misses:
            by_key[m.key].append(m.at)
            by_function[m.function].append(m.at)
        self._by_key: dict[str, list[Known]] = defaultdict(list)
        self._by_function: dict[str, list[Known]] = defaultdict(list)
        seen: set[tuple[str, str | None, int, str]] = set()
        for k in [*self._usage(_untils(by_key), _untils(by_function)), *self._warmups(by_key, by_function)]:
            ident = (k.key, k.run_id, k.process_index, k.kind)
            if ident not in seen:
                seen.add(ident)
                self._by_key[k.key].append(k)
                self._by_function[k.function].append(k)
        self._entries = {k: e for k in sorted(by_key) if (e := self._entry_of(k)) is not None}
        self._function_entries = {f: self._entries_of_function(f) for f in sorted(by_function)}
        self._deletions = {k: self._deletions_of(k) for k in sorted(by_key)}

    def entry(self, key: str) -> EntryNow | None:
        return self._entries.get(key)

    def deletion(self, key: str, *, before: float) -> Deletion | None:
        found = [d for d in self._deletions.get(key, ()) if d.at_s < before]
        return max(found, key=lambda d: d.at_s) if found else None

    def earlier(self, key: str, *, before: float) -> list[Known]:
        return [k for k in self._by_key.get(key, ()) if k.at < before]

    def of_function(self, function: str) -> list[Known]:
        return self._by_function.get(function, [])

    def entries_of_function(self, function: str) -> list[EntryNow]:
        return self._function_entries.get(function, [])

    def _fetch(self, statement: Select, **params: Any) -> list[tuple]:
        return list(self._conn.execute(statement, {"cache": self._cache, **params}))

    def _usage(self, keys: list[tuple[str, float]], functions: list[tuple[str, float]]) -> Iterable[Known]:
        rows = [r for k, until in keys for r in self._fetch(_of_key(), key=k, until=until,
                                                              limit=KEY_ROWS)]
        rows += [r for f, until in functions for r in self._of_function(f, until)]
        rows += [r for f in sorted({f for f, _ in functions})
                 for r in self._fetch(_first_of_function(), function=f, limit=FIRST_ROWS)]
        for r in rows:
            yield known_of_usage(UsageKnown(*r), self._decode)

    def _of_function(self, function: str, until: float) -> list[tuple]:
        # Key by key, newest first: each read skips the keys found so far (an index range, filtered).
        rows: list[tuple] = []
        seen: list[str] = []
        while len(seen) < FUNCTION_KEYS:
            found = self._fetch(_of_function(len(seen)), function=function,
                                until=until, limit=ROWS_PER_KEY, **{f"x{i}": k for i, k in enumerate(seen)})
            rows += found
            new = list(dict.fromkeys(r[0] for r in found if r[0] not in seen))
            if len(found) < ROWS_PER_KEY or not new:
                break
            seen += new
        return rows

    def _warmups(self, keys: dict[str, list[float]], functions: dict[str, list[float]]) -> Iterable[Known]:
        for column, values in (("key", keys), ("function", functions)):
            for value, ats in sorted(values.items()):
                for (key, function, status, reason, parts, program, compile_s, warmup, job, started, fp,
                     topology) in self._fetch(_warmups_of(column), value=value,
                                              until=max(ats), limit=WARMUP_ROWS):
                    yield Known(key=key, function=function, event=_EVENTS.get(status, "compiled"), at=started,
                                job=job, run_id=warmup, kind="warmup", parts=self._decode(parts, KeyParts),
                                program=self._decode(program, ProgramSignature),
                                fingerprint=self._decode(fp, Fingerprint),
                                topology=topology, reason=reason, compile_s=compile_s)

    def _entry_of(self, key: str) -> EntryNow | None:
        for r in self._fetch(_entry(), key=key):
            readable, problem = _readable(*r[1:])
            return EntryNow(key, r[1], readable=readable, compression=_library(r[3]), problem=problem)
        return None

    def _entries_of_function(self, function: str) -> list[EntryNow]:
        return [EntryNow(key, created, compression=_library(compression)) for key, created, compression
                in self._fetch(_entries_of_function(), function=function, limit=FUNCTION_ENTRIES)]

    def _deletions_of(self, key: str) -> list[Deletion]:
        return [Deletion(key, at_s, who, "DELETE" if kind == "delete" else
                         f"prune #{audit_id} ({policy_summary(decoded(policy, dict))})")
                for audit_id, at_s, who, policy, kind in self._fetch(_deletions(), key=key)]


def _untils(times: dict[str, list[float]]) -> list[tuple[str, float]]:
    """(name, until) per group of a name's misses within BUCKET_S, so a batch spanning days reads what each needs."""
    out = []
    for name, ats in sorted(times.items()):
        ats.sort()
        start = ats[0]
        for at, nxt in zip(ats, [*ats[1:], None], strict=True):
            if nxt is None or nxt - start > BUCKET_S:
                out.append((name, at))
                start = nxt if nxt is not None else start
    return out


def known_of_usage(r: Any, decode: Decoder) -> Known:
    """A usage row (with its run's columns) as the engine's :class:`Known`, as from_root reads a run record."""
    return Known(key=r.key, function=r.function, event=r.event, at=r.first_at or r.started_s, job=r.job,
                 run_id=r.run_id, process_index=r.process_index, kind=r.kind, parts=decode(r.parts, KeyParts),
                 program=decode(r.program, ProgramSignature), fingerprint=decode(r.fingerprint, Fingerprint),
                 topology=r.topology, reason=r.reason, compile_s=r.compile_s)


def _library(compression: str | None) -> str | None:
    return next((name for c, name in LIBRARY.items() if c.value == compression), None)


def _readable(created_s: float, size: int, compression: str | None, status: str | None, reason: str | None,
              verdict: str | None, reasons: Any, judged_size: int | None,
              judged_created: float | None) -> tuple[bool | None, str | None]:
    """Whether JAX can load the entry, by its verdict on this version, else its decoded head; None when unjudged."""
    if verdict is not None and (judged_size, judged_created) == (size, created_s):
        if verdict == integrity.CORRUPT:
            return False, "; ".join(decoded(reasons, list[str]) or []) or "corrupt"
        return (None, None) if verdict == integrity.PENDING else (True, None)
    if status == "corrupt":
        return False, reason or "its head does not decode"
    return None, None


def policy_summary(policy: Any, *, limit: int = 200) -> str:
    """A prune's policy in a few words, as the audit log keeps it: ``unused_for 14d, functions jit_a*``."""
    if not isinstance(policy, dict) or not policy:
        return "no policy recorded"
    said = [name if value is True else f"{name} {','.join(map(str, value)) if isinstance(value, list) else value}"
            for name, value in policy.items()]
    return _clip(", ".join(said), limit)


@dataclass(frozen=True, slots=True)
class Pending:
    """A run's miss of a key to explain: its usage row (of a job's run)."""

    run_id: str
    job: str
    key: str


def stored(why: Explanation) -> dict[str, Any]:
    """An explanation as a usage row's columns, clipped to what the API shows."""
    differs = [{"part": d.part, "mine": _clip(d.mine), "theirs": _clip(d.theirs),
                "changes": [_clip(c) for c in d.changes[:_CHANGES]]} for d in why.differs]
    return {"cause": why.cause, "differs": differs, "nearest": why.nearest, "fix": _clip(why.fix)}


def _clip(text: str | None, limit: int = _TEXT) -> Any:
    return text if text is None or len(text) <= limit else text[: limit - 1] + "…"


def explain_pending(conn: Connection, cache: str, pending: Sequence[Pending], *,
                    root: str | None = None) -> Counter[str]:
    """Explain and store the unexplained rows ``pending``; returns the causes of misses not yet counted."""
    counts: Counter[str] = Counter()
    if not pending:
        return counts
    if root is None:
        root = conn.execute(select(CacheRow.url).where(CacheRow.name == cache)).scalar() or "ROOT"
    for batch in batches(pending):
        misses = stored_misses(conn, cache, [(p.run_id, p.job, p.key) for p in batch])
        history = CatalogHistory(conn, cache, [m for m, _, _ in misses])
        params = []
        for miss, missed, counted in misses:
            why = stored(explain(miss, history, root=root))
            params.append({"b_run": miss.run_id, "b_job": miss.job, "b_key": miss.key, "b_counted": missed,
                           **{f"b_{n}": why[n] for n in EXPLANATION}})
            if missed > counted:
                counts[why["cause"]] += missed - counted
        conn.execute(_update_statement(), [{"b_cache": cache, **p} for p in params])
    return counts


def batches(pending: Sequence[Pending]) -> Iterator[Sequence[Pending]]:
    """``pending`` in order, in runs of at most BATCH misses of at most BATCH_KEYS keys."""
    start, keys = 0, set[str]()
    for i, p in enumerate(pending):
        if i - start >= BATCH or (p.key not in keys and len(keys) >= BATCH_KEYS):
            yield pending[start:i]
            start, keys = i, set()
        keys.add(p.key)
    if start < len(pending):
        yield pending[start:]


@functools.cache
def _update_statement() -> Update:
    table = table_of(UsageRow)
    return (update(table).where(table.c.cache == bindparam("b_cache"), table.c.run_id == bindparam("b_run"),
                                table.c.key == bindparam("b_key"), table.c.job == bindparam("b_job"),
                                table.c.kind == JOB)
            .values(counted=bindparam("b_counted"), **{n: bindparam(f"b_{n}") for n in EXPLANATION}))
