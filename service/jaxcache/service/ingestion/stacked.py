"""A batch's changes by usage row, the fast way where it can: the changed processes of one run, job and kind that
all report the same keys are stacked into arrays (a process per row, a key per column) and each key's
:func:`groups.build` is made a column at a time, with no tuple per process and key. In a storm that is every
batch: a job's processes compile the same programs, and each final record is the usual rewrite of the process's
record before (:func:`groups.covered`'s first case, checked here for every process and key at once). Anything
else goes the way of :class:`changes.Parts`, a tuple per process and key."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxcache.records import HIT, JOB, WRITE
from jaxcache.service.ingestion import figures as f
from jaxcache.service.ingestion import groups
from jaxcache.service.ingestion.changes import Change, Parts

Group = tuple[str, str, str]  # run id, job, kind
Ident = tuple[str, str, str, str]  # run id, key, job, kind
Summary = dict[str, Any]  # groups.build's columns of some processes' parts of one row


class Side(NamedTuple):
    """One group's processes on one side (as stored before the batch, or in it), in arrays."""

    keys: list[str]
    processes: np.ndarray  # (P,) process index of each row
    updated: np.ndarray  # (P,) run row's updated_s
    started: np.ndarray  # (P,)
    figures: list[f.Figures]
    columns: dict[str, np.ndarray]  # (P, K) by Figures attribute; None is NaN in float columns


class Work:
    """What the batch's changes make of each usage row they touch."""

    def __init__(self, changes: dict[tuple[str, int], Change]) -> None:
        new: dict[Group, list[tuple[int, Change]]] = {}
        old: dict[Group, list[tuple[int, Change]]] = {}
        moved: set[Group] = set()
        for (run_id, index), c in changes.items():
            group: Group = (run_id, c.record.job, c.record.kind)
            new.setdefault(group, []).append((index, c))
            if c.before is not None:
                was = (run_id, c.before.run["job"], c.before.run["kind"])
                old.setdefault(was, []).append((index, c))
                if was != group:
                    moved |= {was, group}
        self._fast: dict[Group, dict[str, tuple[Summary | None, Summary]]] = {}
        for group, members in new.items():
            if group not in moved:
                rows = _stacked(group[2], members, old.get(group, []))
                if rows is not None:
                    self._fast[group] = rows
        self._parts = Parts({pid: c for pid, c in changes.items()
                             if (pid[0], c.record.job, c.record.kind) not in self._fast})

    def idents(self) -> list[Ident]:
        """Every usage row touched, in order."""
        fast = [(run, key, job, kind) for (run, job, kind), rows in self._fast.items() for key in rows]
        return sorted([*fast, *self._parts.idents()])

    def change(self, ident: Ident, row: dict[str, Any] | None) -> tuple[Summary | None, Summary | None] | None:
        """What the row (None: not stored) loses and gains: :func:`groups.build` of the changed processes' old parts
        and of their new ones. None: the row must be rebuilt from every process's figures (an old part whose
        extremes the new one does not cover, or a row that has processes' old parts but is not stored)."""
        run_id, key, job, kind = ident
        fast = self._fast.get((run_id, job, kind))
        if fast is not None:
            less, more = fast[key]
            return None if row is None and less is not None else (less, more)
        gone = self._parts.removed.get((run_id, job, kind), {}).get(key, {})
        came = self._parts.added.get((run_id, job, kind), {}).get(key, [])
        if gone:
            if row is None:
                return None
            by_process = {part[groups.PROCESS]: part for part in came}
            if not all(groups.covered(row, kind, part, by_process.get(index)) for index, part in gone.items()):
                return None
        return groups.build(kind, list(gone.values())), groups.build(kind, came)


def _stacked(kind: str, new: list[tuple[int, Change]], old: list[tuple[int, Change]]
             ) -> dict[str, tuple[Summary | None, Summary]] | None:
    """Each key's old and new summaries of one group, or None when the group does not take the fast way: its
    processes report different keys, a process's old keys are not all in its new record, or an old part is not
    the usual rewrite of the new one."""
    after = _side([(i, c.figures, c.record.updated_at, c.record.started_at) for i, c in new])
    if after is None:
        return None
    less: dict[str, Summary] = {}
    if old:
        assert all(c.before is not None for _, c in old)
        before = _side([(i, c.before.figures, c.before.run["updated_s"], c.before.run["started_s"])  # type: ignore[union-attr]
                        for i, c in old])
        if before is None or not _rewrites(before, after):
            return None  # checked before any summing: the tuple way does it all again
        less = dict(zip(before.keys, _summaries(kind, before), strict=True))
    return {key: (less.get(key), s) for key, s in zip(after.keys, _summaries(kind, after), strict=True)}


_COUNTS = ("hits", "compiles", "writes")
_NUMBERS = ("compile_s", "retrieval_s", "jax_saved_s", "saved_s", "size_bytes", "first_at", "last_at")
_TEXTS = ("functions", "events", "reasons")


def _side(members: list[tuple[int, f.Figures, float, float]]) -> Side | None:
    """The processes stacked, or None when they do not all report the same keys in the same order."""
    keys = members[0][1].keys
    if any(fig.keys != keys for _, fig, _, _ in members) or len(set(keys)) != len(keys):
        return None
    figures = [fig for _, fig, _, _ in members]
    shape = (len(figures), len(keys))
    columns: dict[str, np.ndarray] = {
        n: np.array([getattr(fig, n) for fig in figures], dtype=np.int64).reshape(shape) for n in _COUNTS}
    columns.update((n, np.array([getattr(fig, n) for fig in figures], dtype=np.float64).reshape(shape))
                   for n in _NUMBERS)
    columns.update((n, np.array([getattr(fig, n) for fig in figures], dtype=object).reshape(shape))
                   for n in _TEXTS)
    columns["ranks"] = np.array([[f.RANK[e] for e in fig.events] for fig in figures], dtype=np.int64).reshape(shape)
    return Side(keys, np.array([m[0] for m in members]), np.array([m[2] for m in members], dtype=np.float64),
                np.array([m[3] for m in members], dtype=np.float64), figures, columns)


def _rewrites(before: Side, after: Side) -> bool:
    """Whether every old part is the usual rewrite of its process's new part (groups.covered's first case)."""
    rows = {int(p): i for i, p in enumerate(after.processes)}
    cols = {k: j for j, k in enumerate(after.keys)}
    if any(int(p) not in rows for p in before.processes) or any(k not in cols for k in before.keys):
        return False
    r = np.array([rows[int(p)] for p in before.processes], dtype=np.intp)
    c = np.array([cols[k] for k in before.keys], dtype=np.intp)  # none: a record before any compile
    o, n = before.columns, {name: a[np.ix_(r, c)] for name, a in after.columns.items()}
    same = [bool(np.all(n[name] == o[name])) for name in (*_TEXTS, "first_at", "writes")]
    same += [_equal(n[name], o[name]) for name in ("size_bytes", "compile_s")]
    if not all(same):
        return False
    if not (np.all(n["last_at"] >= o["last_at"]) and np.all(n["hits"] >= o["hits"])):
        return False
    if not (np.all(after.updated[r] >= before.updated) and np.all(after.started[r] == before.started)):
        return False
    used = o["hits"] != 0
    return bool(np.all(_used_at(n)[used] >= _used_at(o)[used]))


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal, None (NaN) equal to None."""
    return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def _used_at(columns: dict[str, np.ndarray]) -> np.ndarray:
    """Last use, else first (hit_at's time)."""
    return np.where(columns["last_at"] != 0, columns["last_at"], columns["first_at"])


def _summaries(kind: str, side: Side) -> list[Summary]:
    """:func:`groups.build` of each key's parts, a column at a time."""
    col, figures, n_keys = side.columns, side.figures, len(side.keys)
    hits = col["hits"]
    first, last = col["first_at"], col["last_at"]
    sums = {
        "hits": hits.sum(axis=0).tolist(),
        "compiles": col["compiles"].sum(axis=0).tolist(),
        "writes": col["writes"].sum(axis=0).tolist(),
        # Nothing added for None (NaN) or 0, as build's sum over the truthy ones.
        "compile_s": np.nansum(col["compile_s"], axis=0).tolist(),
        "retrieval_s": col["retrieval_s"].sum(axis=0).tolist(),
        "jax_saved_s": col["jax_saved_s"].sum(axis=0).tolist(),
        "saved_s": col["saved_s"].sum(axis=0).tolist(),
        "missed": (col["events"] != HIT).sum(axis=0).tolist() if kind == JOB else [0] * n_keys,
    }
    functions = figures[0].functions
    if any(fig.functions != functions for fig in figures):
        functions = [min(fs) for fs in zip(*(fig.functions for fig in figures), strict=True)]
    reasons: list[str | None] = [None] * n_keys
    if any(fig.reasons.count(None) != n_keys for fig in figures):
        reasons = [max((r for r in rs if r is not None), default=None)
                   for rs in zip(*(fig.reasons for fig in figures), strict=True)]
    events = [groups.EVENT_OF_RANK[r] for r in col["ranks"].max(axis=0).tolist()]
    sizes = [None if np.isnan(s) else int(s) for s in np.fmax.reduce(col["size_bytes"], axis=0).tolist()]
    firsts = np.where(first != 0, first, np.inf).min(axis=0)
    hit_at = [None] * n_keys
    if kind == JOB:
        used = _used_at(col)
        latest = np.where((hits != 0) & (used != 0), used, -np.inf).max(axis=0)
        hit_at = [None if t == -np.inf else t for t in latest.tolist()]
    writers = _writers(side)
    lowest, updated = int(side.processes.min()), float(side.updated.max())
    out = []
    for j, (first_at, last_at) in enumerate(zip(firsts.tolist(), last.max(axis=0).tolist(), strict=True)):
        row = {n: v[j] for n, v in sums.items()}
        row.update(processes=len(figures), process_index=lowest, function=functions[j], event=events[j],
                   reason=reasons[j], size_bytes=sizes[j], first_at=0.0 if first_at == np.inf else first_at,
                   last_at=last_at, last_hit_s=hit_at[j], updated_s=updated)
        row.update(writers[j])
        out.append(row)
    return out


_NO_WRITER: dict[str, Any] = {"writer_process": None, "writer_at_s": None, "writer_compile_s": None}


def _writers(side: Side) -> list[dict[str, Any]]:
    """Each key's earliest write (first use, else its process's start; the lowest process on a tie)."""
    col = side.columns
    wrote = (col["writes"] != 0) | (col["events"] == WRITE)
    if not wrote.any():
        return [_NO_WRITER] * len(side.keys)
    at = np.where(wrote, np.where(col["first_at"] != 0, col["first_at"], side.started[:, None]), np.inf)
    earliest = at.min(axis=0)
    first = np.where(wrote & (at == earliest), side.processes[:, None], np.iinfo(np.int64).max).argmin(axis=0)
    out = []
    for j, (i, when) in enumerate(zip(first.tolist(), earliest.tolist(), strict=True)):
        if when == np.inf:
            out.append(_NO_WRITER)
            continue
        measured = col["compile_s"][i, j]
        out.append({"writer_process": int(side.processes[i]), "writer_at_s": when,
                    "writer_compile_s": None if np.isnan(measured) else float(measured)})
    return out

