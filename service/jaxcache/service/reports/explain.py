"""Explaining misses as records are ingested: each run's miss of a key gets :func:`jaxcache.explain.explain`'s cause,
difference, nearest key and fix, stored on its usage row and kept while what it was made of stays the same."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Update, bindparam, select, update
from sqlalchemy.engine import Connection

from jaxcache.explain import Explanation, explain
from jaxcache.records import JOB
from jaxcache.service.catalog.models import CacheRow, UsageRow, table_of
from jaxcache.service.reports.history import CatalogHistory, stored_misses

#: Misses explained together over one history read: a job's processes miss the same keys and share usage rows.
BATCH_KEYS, BATCH = 1000, 20_000
#: What a stored explanation keeps at most: a program's signature or a run's flags can be long, the API pages are not.
_CHANGES, _TEXT = 50, 2000
#: The explanation's columns on a usage row.
COLUMNS = ("cause", "differs", "nearest", "fix")
#: What an explanation is made of besides the history (the row's and its process's run's); kept while these are.
INPUTS = ("process_index", "event", "first_at", "parts", "program", "reason")
RUN_INPUTS = ("fingerprint_digest", "topology", "started_s")


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


def _clip(text: str | None) -> Any:
    return text if text is None or len(text) <= _TEXT else text[: _TEXT - 1] + "…"


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
                           **{f"b_{n}": why[n] for n in COLUMNS}})
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
            .values(counted=bindparam("b_counted"), **{n: bindparam(f"b_{n}") for n in COLUMNS}))
