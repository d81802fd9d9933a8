"""Jobs' misses as ingestion explained them: by cause over a window, and the latest explanation of a job's keys."""

from __future__ import annotations

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache.service.catalog.models import UsageRow
from jaxcache.service.reports import rules

_MISS = (rules.is_miss(UsageRow.kind, UsageRow.event),)
_CHUNK = 500


def misses_by_cause(s: Session | Connection, cache: str, *, since: float) -> dict:
    """Misses of runs updated since ``since`` by cause, most compile seconds first, and how many are unexplained."""
    rows = s.execute(
        select(UsageRow.cause, func.sum(UsageRow.missed), func.sum(UsageRow.compile_s))
        .where(UsageRow.cache == cache, UsageRow.updated_s >= since, *_MISS)
        .group_by(UsageRow.cause)
    ).all()
    ranked = sorted(((float(sec or 0), int(n or 0), c) for c, n, sec in rows if c),
                    key=lambda t: (-t[0], -t[1], t[2]))
    causes = [{"cause": c, "misses": n, "compile_s": sec} for sec, n, c in ranked]
    unexplained = sum(int(n or 0) for c, n, _ in rows if c is None)
    return {"since_s": since, "causes": causes, "unexplained": unexplained}


def latest_explanations(s: Session | Connection, cache: str, job: str, keys: list[str]) -> dict[str, dict]:
    """For each of ``keys``, the explanation of the job's most recent miss of it that has one."""
    out: dict[str, dict] = {}
    at = func.max(UsageRow.first_at)
    for i in range(0, len(keys), _CHUNK):
        part = keys[i : i + _CHUNK]
        latest = (select(UsageRow.key, at.label("at"))
                  .where(UsageRow.cache == cache, UsageRow.job == job, UsageRow.key.in_(part),
                         UsageRow.cause.is_not(None), *_MISS)
                  .group_by(UsageRow.key).subquery())
        for r in s.execute(
            select(UsageRow.key, UsageRow.cause, UsageRow.differs, UsageRow.nearest, UsageRow.fix)
            .join(latest, and_(latest.c.key == UsageRow.key, latest.c.at == UsageRow.first_at))
            .where(UsageRow.cache == cache, UsageRow.job == job, UsageRow.cause.is_not(None), *_MISS)
            .order_by(UsageRow.key, UsageRow.run_id.desc(), UsageRow.process_index)
        ):
            out.setdefault(r.key, {"cause": r.cause, "differs": r.differs or [], "nearest": r.nearest, "fix": r.fix})
    return out
