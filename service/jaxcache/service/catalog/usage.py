"""The usage rules (:mod:`jaxcache.usage_rules`) in SQL, bound once here for every part that counts usage, and the
usage figures more than one part shows: a window's hit rate, seconds saved by function, misses by cause, records
waiting in the inbox (a cache's statistics, the usage gauges, the jobs' views). Only jobs' runs count as usage:
warm-ups are tools (jaxcache.records.RunKind)."""

from __future__ import annotations

import operator
from functools import partial

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache import usage_rules
from jaxcache.records import JOB
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import EntryRow, InboxRow, RunRow, UsageRow
from jaxcache.usage_rules import Ops

Reader = Session | Connection

#: The rules' operations as SQLAlchemy expressions.
SQL = Ops(
    case=lambda *whens, else_=None: case(*whens, else_=else_), coalesce=func.coalesce, nullif=func.nullif,
    eq=operator.eq, gt=operator.gt, ge=operator.ge, and_=and_, or_=or_,
    sub=operator.sub, mul=operator.mul, nulls_last=lambda x: x.asc().nulls_last(),
)

(used_hits, saved, credited_measure, wrote, write_at, hit_at, is_miss, is_recent, event_rank,
 event_of) = (partial(rule, SQL) for rule in (
    usage_rules.used_hits, usage_rules.saved, usage_rules.credited_measure, usage_rules.wrote, usage_rules.write_at,
    usage_rules.hit_at, usage_rules.is_miss, usage_rules.is_recent, usage_rules.event_rank, usage_rules.event_of))
#: Where a usage row is a job's miss.
MISS = (is_miss(UsageRow.kind, UsageRow.event),)


def hit_rate(hits: int, misses: int) -> float | None:
    return hits / (hits + misses) if hits + misses else None


def usage_window(s: Reader, cache: str, *, since: float) -> dict:
    """Hits, misses, hit rate and seconds saved (and of them, at the writer's time) by the processes whose records
    were updated since ``since``."""
    processes, runs, jobs, hits, misses, saved, writer = s.execute(
        select(func.count(), func.count(func.distinct(RunRow.run_id)), func.count(func.distinct(RunRow.job)),
               func.coalesce(func.sum(RunRow.hits), 0), func.coalesce(func.sum(RunRow.compiles), 0),
               func.coalesce(func.sum(RunRow.saved_s), 0.0), func.coalesce(func.sum(RunRow.saved_writer_s), 0.0))
        .where(RunRow.cache == cache, RunRow.updated_s >= since, RunRow.kind == JOB)
    ).one()
    hits, misses = int(hits), int(misses)
    return {"since_s": since, "jobs": int(jobs), "runs": int(runs), "processes": int(processes), "hits": hits,
            "misses": misses, "hit_rate": hit_rate(hits, misses), "saved_s": float(saved),
            "saved_writer_s": float(writer)}


def saved_by_function(s: Reader, cache: str, *, limit: int = 100) -> list[dict]:
    """Functions whose entries (in the cache now) saved the most compile seconds: entries, hits, seconds saved (and of
    them, at the writer's time: entries no job compiled)."""
    saved = func.sum(EntryRow.saved_s)
    writer = func.sum(case((EntryRow.platform_compile_s.is_(None), EntryRow.saved_s), else_=0.0))
    rows = s.execute(
        select(EntryRow.module, func.count(), func.sum(EntryRow.hits), saved, writer)
        .where(EntryRow.cache == cache, EntryRow.kind == "entry", EntryRow.saved_s > 0)
        .group_by(EntryRow.module).order_by(saved.desc(), EntryRow.module).limit(limit)
    ).all()
    return [{"function": m, "entries": int(n), "hits": int(h or 0), "saved_s": float(sv or 0),
             "saved_writer_s": float(w or 0)} for m, n, h, sv, w in rows]


def misses_by_cause(s: Reader, cache: str, *, since: float) -> dict:
    """Misses of runs updated since ``since`` by cause, most compile seconds first, and how many are unexplained."""
    rows = s.execute(
        select(UsageRow.cause, func.sum(UsageRow.missed), func.sum(UsageRow.compile_s))
        .where(UsageRow.cache == cache, UsageRow.updated_s >= since, *MISS)
        .group_by(UsageRow.cause)
    ).all()
    ranked = sorted(((float(sec or 0), int(n or 0), c) for c, n, sec in rows if c),
                    key=lambda t: (-t[0], -t[1], t[2]))
    causes = [{"cause": c, "misses": n, "compile_s": sec} for sec, n, c in ranked]
    unexplained = sum(int(n or 0) for c, n, _ in rows if c is None)
    return {"since_s": since, "causes": causes, "unexplained": unexplained}


def waiting_by_cache(catalog: Catalog) -> dict[str, int]:
    """Records in the inbox, by cache."""
    with catalog.statements() as conn:
        return {c: int(n) for c, n in conn.execute(select(InboxRow.cache, func.count()).group_by(InboxRow.cache))}
