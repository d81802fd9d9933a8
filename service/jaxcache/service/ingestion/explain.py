"""Explaining misses as their records are ingested: each job's miss (a usage row of event write or compiled) gets
its cause, what differs, the nearest key and the fix from :func:`jaxcache.explain.explain` over the catalog's
history, stored on the row. A row keeps its explanation when its record is ingested again unchanged; it is counted
(``jaxcache_misses_total``) the first time it is explained only. docs/service.md, "Explained misses"."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import Select, Text, Update, bindparam, cast, or_, select, update
from sqlalchemy.orm import Session

from jaxcache import records
from jaxcache.explain import Explanation, explain
from jaxcache.service.catalog import rawsql
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import CacheRow, UsageRow, table_of
from jaxcache.service.catalog.queries.history import CatalogHistory, stored_misses

#: Misses explained together: one history is read for all of them, up to this many keys (a key's history is up to
#: KEY_ROWS rows) and misses. A job's processes miss the same keys: a storm's 60,000 misses of 60 keys take three
#: batches, not sixty (explaining them on SQLite took 7.3 s in batches of 1,000 misses, 2.6 s in these).
BATCH_KEYS, BATCH = 1000, 20_000
#: What a stored explanation keeps at most: a program's signature or a run's flags can be long, the API pages are not.
_CHANGES, _TEXT = 50, 2000
#: The explanation's columns on a usage row.
COLUMNS = ("cause", "differs", "nearest", "fix")
#: What a miss's explanation is made of, besides the history: a row whose record changes keeps its explanation
#: while these stay as they were.
INPUTS = ("event", "first_at", "parts", "program", "reason", "kind", "job")


@dataclass(frozen=True, slots=True)
class Pending:
    """A stored miss to explain; ``counted``: whether it is a miss not explained (so not counted) before."""

    run_id: str
    process_index: int
    key: str
    counted: bool


def is_miss(kind: str, event: str) -> bool:
    """A job's process compiled the key: the cache did not give it (jaxcache.explain.from_root.is_miss)."""
    return kind == records.JOB and event in (records.WRITE, records.COMPILED)


def stored(why: Explanation) -> dict[str, Any]:
    """An explanation as a usage row's columns, clipped to what the API shows."""
    differs = [{"part": d.part, "mine": _clip(d.mine), "theirs": _clip(d.theirs),
                "changes": [_clip(c) for c in d.changes[:_CHANGES]]} for d in why.differs]
    return {"cause": why.cause, "differs": differs, "nearest": why.nearest, "fix": _clip(why.fix)}


def _clip(text: str | None) -> Any:
    return text if text is None or len(text) <= _TEXT else text[: _TEXT - 1] + "…"


#: The JSON columns among INPUTS and COLUMNS, read back as their text (see :func:`as_stored`).
_JSON = ("parts", "program", "differs")


def stored_statement() -> Select:
    """A process's stored misses: the key, then INPUTS and COLUMNS (for rawsql: JSON columns as their text)."""
    u = UsageRow
    columns = [cast(getattr(u, n), Text) if n in _JSON else getattr(u, n) for n in (*INPUTS, *COLUMNS)]
    return (select(u.key, *columns)
            .where(u.cache == bindparam("cache"), u.run_id == bindparam("run_id"),
                   u.process_index == bindparam("process_index"), u.kind == records.JOB,
                   or_(u.event == records.WRITE, u.event == records.COMPILED)))


def as_stored(row: Sequence[Any]) -> dict[str, Any]:
    """A row of :func:`stored_statement` as the columns' values, as a new usage row holds them."""
    out = dict(zip((*INPUTS, *COLUMNS), row[1:], strict=True))
    for name in _JSON:
        if out[name] is not None:
            out[name] = msgspec.json.decode(out[name])
    return out


def carried(old: Mapping[str, Any] | None, new: Mapping[str, Any], same_run: bool) -> dict[str, Any] | None:
    """The explanation ``new`` (a usage row about to be stored) keeps from ``old`` (its process's previous row of
    the key), when nothing it was made of changed; None: explain it again."""
    if old is None or old["cause"] is None or not same_run:
        return None
    if any(old[name] != new[name] for name in INPUTS):
        return None
    return {name: old[name] for name in COLUMNS}


def explain_pending(s: Session, cache: str, pending: Sequence[Pending], *, root: str | None = None) -> Counter[str]:
    """Explain the stored misses ``pending`` and store their explanations (in ``s``'s transaction); the causes of
    those ``counted``, for the metric."""
    counts: Counter[str] = Counter()
    if not pending:
        return counts
    conn = s.connection()
    if root is None:
        found = rawsql.fetch(conn, "explain-root", _root_statement, {"cache": cache})
        root = found[0][0] if found else "ROOT"
    for batch in batches(pending):
        counted = {(p.run_id, p.process_index, p.key) for p in batch if p.counted}
        misses = stored_misses(conn, cache, [(p.run_id, p.process_index, p.key) for p in batch])
        history = CatalogHistory(conn, cache, misses)
        params = []
        for miss in misses:
            why = stored(explain(miss, history, root=root))
            params.append({"b_run": miss.run_id, "b_process": miss.process_index, "b_key": miss.key,
                           **{f"b_{n}": why[n] for n in COLUMNS}})
            if (miss.run_id, miss.process_index, miss.key) in counted:
                counts[why["cause"]] += 1
        # The driver's executemany (rawsql): SQLAlchemy's processed every value in Python first.
        rawsql.execute_many(conn, "explain-update", _update_statement,
                            [{"b_cache": cache, **p, "b_differs": _json(p["b_differs"])} for p in params])
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


def _json(value: Any) -> str | None:
    return None if value is None else msgspec.json.encode(value).decode()


def _root_statement() -> Select:
    return select(CacheRow.url).where(CacheRow.name == bindparam("cache"))


@functools.cache
def _update_statement() -> Update:
    # Built once: building the expression costs more than running it on one row.
    table = table_of(UsageRow)
    return (update(table).where(table.c.cache == bindparam("b_cache"), table.c.run_id == bindparam("b_run"),
                                table.c.process_index == bindparam("b_process"), table.c.key == bindparam("b_key"))
            .values(**{n: bindparam(f"b_{n}") for n in COLUMNS}))


def explain_stored(catalog: Catalog, cache: str, pending: Sequence[Pending], *,
                   root: str | None = None) -> Counter[str]:
    """:func:`explain_pending` in write transactions of its own (a rescan's, once its records are all in), one per
    batch; passes the counts to the catalog's listener."""
    counts: Counter[str] = Counter()
    for batch in batches(pending):
        with catalog.writing(cache) as s:
            counts.update(explain_pending(s, cache, batch, root=root))
    catalog.count_misses(cache, counts)
    return counts
