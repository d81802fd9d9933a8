"""What run records say: hit rates and seconds saved over a window, per job, per function, per process.

Only jobs' runs count (``kind`` "job"): a warm-up and its verify run are tools, not jobs (jaxcache.records.RunKind).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache.records import JOB
from jaxcache.service.catalog.models import EntryRow, RunRow, UsageRow
from jaxcache.service.reports.misses import latest_explanations
from jaxcache.service.reports.usage import is_recent


def _rate(hits: int, misses: int) -> float | None:
    return hits / (hits + misses) if hits + misses else None


def usage_window(s: Session | Connection, cache: str, *, since: float) -> dict:
    """Hits, misses, hit rate and seconds saved by the processes whose records were updated since ``since``."""
    processes, runs, jobs, hits, misses, saved = s.execute(
        select(func.count(), func.count(func.distinct(RunRow.run_id)), func.count(func.distinct(RunRow.job)),
               func.coalesce(func.sum(RunRow.hits), 0), func.coalesce(func.sum(RunRow.compiles), 0),
               func.coalesce(func.sum(RunRow.saved_s), 0.0))
        .where(RunRow.cache == cache, RunRow.updated_s >= since, RunRow.kind == JOB)
    ).one()
    hits, misses = int(hits), int(misses)
    return {"since_s": since, "jobs": int(jobs), "runs": int(runs), "processes": int(processes), "hits": hits,
            "misses": misses, "hit_rate": _rate(hits, misses), "saved_s": float(saved)}


def saved_by_function(s: Session | Connection, cache: str, *, limit: int = 100) -> list[dict]:
    """Functions whose entries (in the cache now) saved the most compile seconds: entries, hits, seconds saved."""
    saved = func.sum(EntryRow.saved_s)
    rows = s.execute(
        select(EntryRow.module, func.count(), func.sum(EntryRow.hits), saved)
        .where(EntryRow.cache == cache, EntryRow.kind == "entry", EntryRow.saved_s > 0)
        .group_by(EntryRow.module).order_by(saved.desc(), EntryRow.module).limit(limit)
    ).all()
    return [{"function": m, "entries": int(n), "hits": int(h or 0), "saved_s": float(sv or 0)}
            for m, n, h, sv in rows]


def recent_jaxlibs(s: Session | Connection, cache: str, *, since: float) -> set[str]:
    """The jaxlib versions of runs whose records were updated since ``since``. Warm-ups' too: a warm-up for a new
    jaxlib runs before its jobs do, and what it wrote must not look stale to a prune meanwhile."""
    return set(s.scalars(select(RunRow.jaxlib).where(RunRow.cache == cache, is_recent(RunRow.updated_s, since))
                      .distinct()))


def jobs(s: Session | Connection, cache: str, *, job: str | None = None, limit: int = 1000) -> list[dict]:
    """Per job (newest run first): runs, processes, hits, misses, writes, hit rate, compile seconds spent,
    seconds saved, first and last run, and the jax/jaxlib versions and topologies seen."""
    runs_q = select(RunRow.job, func.count(func.distinct(RunRow.run_id)), func.count(), func.min(RunRow.started_s),
                    func.max(RunRow.updated_s)).where(RunRow.cache == cache, RunRow.kind == JOB)
    if job is not None:
        runs_q = runs_q.where(RunRow.job == job)
    runs_q = runs_q.group_by(RunRow.job).order_by(func.max(RunRow.updated_s).desc(), RunRow.job).limit(limit)
    out: dict[str, dict[str, Any]]
    out = {j: {"job": j, "runs": int(r), "processes": int(p), "first_run_s": first, "last_run_s": last,
               "hits": 0, "misses": 0, "writes": 0, "hit_rate": None, "compile_s": 0.0, "saved_s": 0.0,
               "jax": [], "jaxlib": [], "topologies": []}
           for j, r, p, first, last in s.execute(runs_q)}
    if not out:
        return []
    names = list(out)
    for j, h, m, w, c, sv in s.execute(
        select(UsageRow.job, func.sum(UsageRow.hits), func.sum(UsageRow.compiles), func.sum(UsageRow.writes),
               func.sum(func.coalesce(UsageRow.compile_s, 0.0)), func.sum(UsageRow.saved_s))
        .where(UsageRow.cache == cache, UsageRow.job.in_(names), UsageRow.kind == JOB).group_by(UsageRow.job)
    ):
        d = out[j]
        d.update(hits=int(h or 0), misses=int(m or 0), writes=int(w or 0), compile_s=float(c or 0),
                 saved_s=float(sv or 0), hit_rate=_rate(int(h or 0), int(m or 0)))
    for j, jax, jaxlib, topology in s.execute(
        select(RunRow.job, RunRow.jax, RunRow.jaxlib, RunRow.topology)
        .where(RunRow.cache == cache, RunRow.job.in_(names), RunRow.kind == JOB).distinct()
    ):
        d = out[j]
        for field, value in (("jax", jax), ("jaxlib", jaxlib), ("topologies", topology)):
            if value is not None and value not in d[field]:
                d[field].append(value)
    for d in out.values():
        for field in ("jax", "jaxlib", "topologies"):
            d[field].sort()
    return list(out.values())


def job_misses(s: Session | Connection, cache: str, job: str, *, limit: int) -> list[dict]:
    """Keys the job compiled because the cache did not have them, most compile seconds first, each with the
    explanation of its most recent miss (:mod:`.misses`)."""
    spent = func.sum(func.coalesce(UsageRow.compile_s, 0.0))
    rows = s.execute(
        select(UsageRow.key, UsageRow.function, func.sum(UsageRow.compiles), spent, func.sum(UsageRow.writes),
               func.max(UsageRow.reason))
        .where(UsageRow.cache == cache, UsageRow.job == job, UsageRow.kind == JOB, UsageRow.compiles > 0)
        .group_by(UsageRow.key, UsageRow.function).order_by(spent.desc(), UsageRow.key).limit(limit)
    ).all()
    present = set(s.scalars(select(EntryRow.key).where(
        EntryRow.cache == cache, EntryRow.kind == "entry", EntryRow.key.in_([r[0] for r in rows]))))
    why = latest_explanations(s, cache, job, [r[0] for r in rows])
    none: dict[str, object] = {"cause": None, "differs": [], "nearest": None, "fix": None}
    return [{"key": k, "function": f, "compiles": int(n), "compile_s": float(c), "written": bool(w),
             "reason": reason, "in_cache": k in present, **why.get(k, none)} for k, f, n, c, w, reason in rows]


def job_runs(s: Session | Connection, cache: str, job: str, *, limit: int) -> list[dict]:
    """The job's processes, newest record first, with their own hits, misses, writes and seconds saved."""
    rows = s.execute(
        select(RunRow.run_id, RunRow.process_index, RunRow.process_count, RunRow.host, RunRow.topology, RunRow.jax,
               RunRow.jaxlib, RunRow.fingerprint_digest, RunRow.started_s, RunRow.updated_s, RunRow.final,
               RunRow.hits, RunRow.compiles, RunRow.writes, RunRow.saved_s, RunRow.local)
        .where(RunRow.cache == cache, RunRow.job == job, RunRow.kind == JOB)
        .order_by(RunRow.updated_s.desc(), RunRow.run_id, RunRow.process_index).limit(limit)
    ).all()
    out = []
    for r in rows:
        h, m, w, sv = int(r.hits), int(r.compiles), int(r.writes), float(r.saved_s)
        out.append({"run_id": r.run_id, "process_index": r.process_index, "process_count": r.process_count,
                    "host": r.host, "topology": r.topology, "jax": r.jax, "jaxlib": r.jaxlib,
                    "fingerprint_digest": r.fingerprint_digest, "started_s": r.started_s, "updated_s": r.updated_s,
                    "final": r.final, "hits": h, "misses": m, "writes": w, "hit_rate": _rate(h, m),
                    "saved_s": sv, "local": r.local})
    return out
