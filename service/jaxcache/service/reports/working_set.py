"""A job's working set: ``jaxcache.working_set.from_root``'s rules in SQL, so the service answers what reading the
root would; ties break by key, as the catalog keeps no record or program order."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Select, case, cast, select
from sqlalchemy.engine import Connection

from jaxcache.coverage import NOT_WRITTEN
from jaxcache.records import COMPILED, JOB, Fingerprint
from jaxcache.service.catalog.models import AttestationRow, ProcessKeysRow, RunRow, WarmupKeyRow, WarmupRow
from jaxcache.service.reports.misses import decoded
from jaxcache.service.reports.usage import chunks
from jaxcache.working_set import DEFAULT_DAYS, DEFAULT_RUNS, Wanted, WorkingSet

DAY = 86400.0
_CHUNK = 500


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


def _runs(cache: str, job: str, days: int, now: float) -> Select:
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
    run_q = _runs(cache, job, days, now)
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
