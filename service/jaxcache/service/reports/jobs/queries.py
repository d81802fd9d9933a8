"""The run tables' reads: usage over a window, jobs (totals, misses with their explanations, processes), misses by
cause, and a job's working set. Only jobs' runs count as usage: warm-ups are tools (jaxcache.records.RunKind)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Select, and_, case, cast, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache.coverage import NOT_WRITTEN
from jaxcache.records import COMPILED, JOB, Fingerprint
from jaxcache.service.catalog.models import (
    AttestationRow,
    EntryRow,
    ProcessKeysRow,
    RunRow,
    UsageRow,
    WarmupKeyRow,
    WarmupRow,
)
from jaxcache.service.catalog.usage import MISS, hit_rate, is_recent
from jaxcache.service.catalog.usage import usage_window as usage_window  # the usage gauges read it here
from jaxcache.service.reports.ingest.misses import decoded
from jaxcache.service.reports.ingest.usage import chunks
from jaxcache.working_set import DEFAULT_DAYS, DEFAULT_RUNS, Wanted, WorkingSet

Reader = Session | Connection
DAY = 86400.0
_CHUNK = 500
_SEEN = ("jax", "jaxlib", "topologies")


def recent_jaxlibs(s: Reader, cache: str, *, since: float) -> set[str]:
    """The jaxlib versions of runs updated since ``since``, warm-ups' too: a prune must not take what a warm-up for a
    new jaxlib just wrote for stale."""
    return set(s.scalars(select(RunRow.jaxlib).where(RunRow.cache == cache, is_recent(RunRow.updated_s, since))
                         .distinct()))


def jobs(s: Reader, cache: str, *, job: str | None = None, limit: int = 1000) -> list[dict]:
    """Per job (newest run first): runs, processes, hits, misses, writes, hit rate, compile seconds spent, seconds
    saved, first and last run, and the jax/jaxlib versions and topologies seen."""
    runs_q = select(RunRow.job, func.count(func.distinct(RunRow.run_id)), func.count(), func.min(RunRow.started_s),
                    func.max(RunRow.updated_s)).where(RunRow.cache == cache, RunRow.kind == JOB)
    if job is not None:
        runs_q = runs_q.where(RunRow.job == job)
    runs_q = runs_q.group_by(RunRow.job).order_by(func.max(RunRow.updated_s).desc(), RunRow.job).limit(limit)
    out: dict[str, dict[str, Any]] = {
        j: {"job": j, "runs": int(r), "processes": int(p), "first_run_s": first, "last_run_s": last, "hits": 0,
            "misses": 0, "writes": 0, "hit_rate": None, "compile_s": 0.0, "saved_s": 0.0, "saved_writer_s": 0.0,
            **{f: set() for f in _SEEN}}
        for j, r, p, first, last in s.execute(runs_q)}
    if not out:
        return []
    names = list(out)
    for j, h, m, w, c, sv in s.execute(
        select(UsageRow.job, func.sum(UsageRow.hits), func.sum(UsageRow.compiles), func.sum(UsageRow.writes),
               func.sum(func.coalesce(UsageRow.compile_s, 0.0)), func.sum(UsageRow.saved_s))
        .where(UsageRow.cache == cache, UsageRow.job.in_(names), UsageRow.kind == JOB).group_by(UsageRow.job)
    ):
        out[j].update(hits=int(h or 0), misses=int(m or 0), writes=int(w or 0), compile_s=float(c or 0),
                      saved_s=float(sv or 0), hit_rate=hit_rate(int(h or 0), int(m or 0)))
    for j, writer in s.execute(select(RunRow.job, func.sum(RunRow.saved_writer_s))
                               .where(RunRow.cache == cache, RunRow.job.in_(names), RunRow.kind == JOB)
                               .group_by(RunRow.job)):
        out[j]["saved_writer_s"] = float(writer or 0)
    for j, *seen in s.execute(select(RunRow.job, RunRow.jax, RunRow.jaxlib, RunRow.topology)
                              .where(RunRow.cache == cache, RunRow.job.in_(names), RunRow.kind == JOB).distinct()):
        for field, value in zip(_SEEN, seen, strict=True):
            out[j][field].add(value)
    return [d | {f: sorted(d[f] - {None}) for f in _SEEN} for d in out.values()]


def job_misses(s: Reader, cache: str, job: str, *, limit: int) -> list[dict]:
    """The job's misses by key and cause, most compile seconds first: how many misses (one per process that compiled
    the key because the cache did not give it, as ``jaxcache explain`` and the cache's misses by cause count them),
    the seconds they took, and the explanation of the most recent of them. A key that missed for two causes (a
    changed program, then a run that found it unwritten) is two rows; misses not explained yet have cause None."""
    spent = func.sum(func.coalesce(UsageRow.compile_s, 0.0))
    rows = s.execute(
        select(UsageRow.key, UsageRow.function, UsageRow.cause, func.sum(UsageRow.missed), func.sum(UsageRow.compiles),
               spent, func.sum(UsageRow.writes), func.max(UsageRow.reason))
        .where(UsageRow.cache == cache, UsageRow.job == job, *MISS)
        .group_by(UsageRow.key, UsageRow.function, UsageRow.cause)
        .order_by(spent.desc(), UsageRow.key, UsageRow.cause).limit(limit)
    ).all()
    present = set(s.scalars(select(EntryRow.key).where(
        EntryRow.cache == cache, EntryRow.kind == "entry", EntryRow.key.in_([r[0] for r in rows]))))
    why = latest_explanations(s, cache, job, [r[0] for r in rows])
    none: dict[str, object] = {"cause": None, "differs": [], "nearest": None, "fix": None}
    return [{"key": k, "function": f, "misses": int(m or 0), "compiles": int(n), "compile_s": float(c),
             "written": bool(w), "reason": reason, "in_cache": k in present, **why.get((k, cause), none)}
            for k, f, cause, m, n, c, w, reason in rows]


def job_runs(s: Reader, cache: str, job: str, *, limit: int) -> list[dict]:
    """The job's processes, newest record first, with their own hits, misses, writes and seconds saved."""
    rows = s.execute(
        select(RunRow.run_id, RunRow.process_index, RunRow.process_count, RunRow.host, RunRow.topology, RunRow.jax,
               RunRow.jaxlib, RunRow.fingerprint_digest, RunRow.started_s, RunRow.updated_s, RunRow.final,
               RunRow.hits, RunRow.compiles.label("misses"), RunRow.writes, RunRow.saved_s, RunRow.saved_writer_s,
               RunRow.machine, RunRow.local)
        .where(RunRow.cache == cache, RunRow.job == job, RunRow.kind == JOB)
        .order_by(RunRow.updated_s.desc(), RunRow.run_id, RunRow.process_index).limit(limit)
    ).all()
    return [{**r._asdict(), "hit_rate": hit_rate(r.hits, r.misses)} for r in rows]


def latest_explanations(s: Reader, cache: str, job: str, keys: list[str]) -> dict[tuple[str, str | None], dict]:
    """For each of ``keys`` and each cause the job's misses of it had, the explanation of the most recent."""
    out: dict[tuple[str, str | None], dict] = {}
    at = func.max(UsageRow.first_at)
    for part in chunks(keys, _CHUNK):
        latest = (select(UsageRow.key, UsageRow.cause, at.label("at"))
                  .where(UsageRow.cache == cache, UsageRow.job == job, UsageRow.key.in_(part),
                         UsageRow.cause.is_not(None), *MISS)
                  .group_by(UsageRow.key, UsageRow.cause).subquery())
        for r in s.execute(
            select(UsageRow.key, UsageRow.cause, UsageRow.differs, UsageRow.nearest, UsageRow.fix)
            .join(latest, and_(latest.c.key == UsageRow.key, latest.c.cause == UsageRow.cause,
                               latest.c.at == UsageRow.first_at))
            .where(UsageRow.cache == cache, UsageRow.job == job, UsageRow.cause.is_not(None), *MISS)
            .order_by(UsageRow.key, UsageRow.run_id.desc(), UsageRow.process_index)
        ):
            out.setdefault((r.key, r.cause), {"cause": r.cause, "differs": r.differs or [], "nearest": r.nearest,
                                               "fix": r.fix})
    return out


# --- a job's working set: jaxcache.working_set.from_root's rules in SQL (ties break by key) -----------------------


def _matching(column: Any, wanted: Wanted) -> list[ColumnElement[bool]]:
    """Conditions on a fingerprint JSON column: each field ``wanted`` knows equals the stored one."""
    out = []
    for name, value in dataclasses.asdict(wanted).items():
        if value is not None:
            field = column[name].as_string()
            out.append((cast(field, BigInteger) if isinstance(value, int) else field) == value)  # counts < 2**53
    return out


def _fill(conn: Connection, q: Select, column: Any, wanted: Wanted) -> tuple[Wanted, Fingerprint | None]:
    """``wanted`` filled from the first matching row of ``q``, and that row's fingerprint (None if none matches)."""
    found = decoded(conn.execute(q.with_only_columns(column).where(*_matching(column, wanted)).limit(1)).scalar(),
                    Fingerprint)
    return (wanted, None) if found is None else (wanted.filled_from(found), found)


def _job_runs(cache: str, job: str, days: int, now: float) -> Select:
    """The job's process-0 job runs started within ``days`` UTC days up to today, in the root's reading order."""
    today = now // DAY * DAY  # Unix days start at UTC midnight
    r = RunRow
    day = case(*((r.started_s >= today - i * DAY, i) for i in range(days)))
    return (select(r.run_id)
            .where(r.cache == cache, r.job == job, r.kind == JOB, r.process_index == 0,
                   r.started_s >= today - (days - 1) * DAY, r.started_s < today + DAY)
            .order_by(day, r.updated_s.desc(), r.run_id))


def working_set(conn: Connection, cache: str, job: str, wanted: Wanted, *, runs: int = DEFAULT_RUNS,
                days: int = DEFAULT_DAYS, now: float | None = None) -> WorkingSet:
    """``job``'s working set from its newest ``runs`` matching runs and warm-ups within ``days`` days."""
    now = time.time() if now is None else now
    found = WorkingSet(job=job)
    run_q = _job_runs(cache, job, days, now)
    wanted, found.fingerprint = _fill(conn, run_q, RunRow.fingerprint, wanted)
    if found.fingerprint is not None:
        found.runs = list(conn.scalars(run_q.where(*_matching(RunRow.fingerprint, wanted)).limit(runs)))
    w = WarmupRow
    warm_q = (select(w.id).where(w.cache == cache, w.job == job, w.finished_s >= now - days * DAY)
              .order_by(w.finished_s.desc(), w.id))
    if found.fingerprint is None:
        wanted, found.fingerprint = _fill(conn, warm_q, w.fingerprint, wanted)
    if found.fingerprint is not None:
        found.warmups = list(conn.scalars(warm_q.where(*_matching(w.fingerprint, wanted))))
    keys: list[str] = []
    if found.runs:
        pk = ProcessKeysRow
        keys += conn.scalars(
            select(pk.key).where(pk.cache == cache, pk.run_id.in_(found.runs), pk.process_index == 0,
                                 pk.event != COMPILED)
            .order_by(case({run: i for i, run in enumerate(found.runs)}, value=pk.run_id), pk.first_at, pk.key))
    if found.warmups:
        wk = WarmupKeyRow
        keys += conn.scalars(
            select(wk.key).where(wk.cache == cache, wk.warmup_id.in_(found.warmups), wk.status != NOT_WRITTEN)
            .order_by(case({wid: i for i, wid in enumerate(found.warmups)}, value=wk.warmup_id), wk.key))
    found.keys = list(dict.fromkeys(keys))
    a = AttestationRow
    for part in chunks(found.keys, _CHUNK):
        found.sha256.update(conn.execute(select(a.key, a.sha256).where(a.cache == cache, a.key.in_(part))).all())
    return found
