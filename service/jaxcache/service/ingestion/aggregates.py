"""Per-key aggregates of run records (first writer, hits, last hit, seconds saved), computed from every process's
rows of a key plus the key's compacted history, and their copies on entry rows. Seconds saved and retention:
docs/service.md, "Run records"."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import BindParameter, Float, and_, bindparam, case, cast, delete, insert, select, update
from sqlalchemy.orm import Session

from jaxcache import records
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import (
    AGGREGATES,
    EntryRow,
    KeyHistoryRow,
    KeyStatsRow,
    RunRow,
    UsageRow,
    table_of,
)

_CHUNK = 500


def wrote(event: str, writes: int) -> bool:
    """Whether a usage row records a write of its key."""
    return writes > 0 or event == records.WRITE


def used_hits(kind: str, hits: int) -> int:
    """The hits of a usage row that count as use of its key: a job's. A warm-up's run is not use, and its verify
    run hits every key the warm-up just wrote; counted, they would make a warm-up "hit since" itself and keep its
    entries from LRU prunes. Their writes still count (a warm-up is often a key's first writer)."""
    return hits if kind == records.JOB else 0


def hit_at(hits: int, first_at: float, last_at: float) -> float | None:
    """When a usage row last hit its key (None: it never did)."""
    return (last_at or first_at or None) if hits else None


def saved_of_row(hits: int, retrieval_s: float, jax_saved_s: float, writer_compile_s: float | None) -> float:
    if not hits:
        return 0.0
    if writer_compile_s is not None:
        ours = hits * writer_compile_s - retrieval_s
        if ours > 0:
            return ours
    return max(jax_saved_s, 0.0)


#: A usage row joined with its run: what aggregates are computed from.
USAGE_JOIN = and_(RunRow.cache == UsageRow.cache, RunRow.run_id == UsageRow.run_id,
             RunRow.process_index == UsageRow.process_index)
USAGE_COLUMNS = (
    UsageRow.key, UsageRow.run_id, UsageRow.process_index, UsageRow.job, UsageRow.kind, UsageRow.event, UsageRow.hits,
    UsageRow.writes, UsageRow.compile_s, UsageRow.retrieval_s, UsageRow.jax_saved_s, UsageRow.saved_s,
    UsageRow.first_at, UsageRow.last_at, RunRow.host, RunRow.topology, RunRow.jax, RunRow.jaxlib, RunRow.started_s,
)


EMPTY = {name: None for name in AGGREGATES} | {"hits": 0, "saved_s": 0.0}
WRITER = tuple(n for n in AGGREGATES if n.startswith("writer_"))


def writer_of(r) -> dict:
    """The writer fields of a usage row (joined with its run) that wrote its key."""
    return {"writer_job": r.job, "writer_run": r.run_id, "writer_process": r.process_index, "writer_host": r.host,
            "writer_topology": r.topology, "writer_jax": r.jax, "writer_jaxlib": r.jaxlib,
            # A record without first_at (0) falls back to its process's start.
            "writer_at_s": r.first_at or r.started_s, "writer_compile_s": r.compile_s}


def _order(w: dict) -> tuple:
    return w["writer_at_s"], w["writer_run"], w["writer_process"]


def earliest_writer(rows: Iterable, history: dict | None) -> dict | None:
    """The first writer among ``rows`` and the compacted runs' (``history``): the earliest write, ties broken by
    run id and process index, so every replica agrees whatever order records arrive in."""
    found = [writer_of(r) for r in rows if wrote(r.event, r.writes)]
    if history is not None and history["writer_run"] is not None:
        found.append({n: history[n] for n in WRITER})
    return min(found, key=_order, default=None)


def aggregate(rows: Iterable, history: dict | None = None) -> tuple[dict, list[tuple[str, int, float]]]:
    """Aggregates of one key from its usage rows (joined with their runs) and its compacted runs' (``history``,
    a key_history row as a dict), and ``(run_id, process_index, saved_s)`` for each row whose saved seconds
    change. Only jobs' hits count (:func:`used_hits`); history's seconds saved are kept as they were."""
    rows = list(rows)
    writer = earliest_writer(rows, history)
    writer_compile_s = writer["writer_compile_s"] if writer is not None else None
    hits = history["hits"] if history else 0
    last_hit: float | None = history["last_hit_s"] if history else None
    saved = history["saved_s"] if history else 0.0
    changed = []
    for r in rows:
        used = used_hits(r.kind, r.hits)
        row_saved = saved_of_row(used, r.retrieval_s, r.jax_saved_s, writer_compile_s)
        if row_saved != r.saved_s:
            changed.append((r.run_id, r.process_index, row_saved))
        saved += row_saved
        if used:
            hits += used
            at = hit_at(used, r.first_at, r.last_at)
            if at is not None and (last_hit is None or at > last_hit):
                last_hit = at
    stats = {"hits": hits, "last_hit_s": last_hit, "saved_s": saved, **(writer or dict.fromkeys(WRITER))}
    return stats, changed


def fold(history: dict | None, rows: Iterable) -> dict:
    """``history`` with compacted usage rows (joined with their runs) added: jobs' hits, the last hit, the
    seconds saved as the rows hold them (their key's writer's measure when they were compacted), the writer."""
    rows = list(rows)
    hits: int = history["hits"] if history else 0
    saved: float = history["saved_s"] if history else 0.0
    last_hit: float | None = history["last_hit_s"] if history else None
    for r in rows:
        used = used_hits(r.kind, r.hits)
        hits += used
        saved += r.saved_s
        at = hit_at(used, r.first_at, r.last_at)
        if at is not None and (last_hit is None or at > last_hit):
            last_hit = at
    writer = earliest_writer(rows, history) or dict.fromkeys(WRITER)
    return {"hits": hits, "last_hit_s": last_hit, "saved_s": saved, **writer}


def entry_params(key: str, stats: dict) -> dict:
    """The parameters of :func:`entry_update_statement` that copy ``stats`` (a key's aggregates) onto ``key``'s row."""
    return {"b_key": key, **{f"b_{n}": stats[n] for n in AGGREGATES}}


def entry_update_statement(cache: str | BindParameter[str]):
    """UPDATE of an entry row's copy of its key's aggregates (parameters ``b_key`` and ``b_<aggregate>``; ``cache``
    a name, or a bound parameter of its own); its last use becomes the newer of what storage shows and the last
    hit."""
    entries = table_of(EntryRow)
    # Typed on the server too: PostgreSQL cannot infer the type of a parameter that is only tested for NULL.
    hit = cast(bindparam("b_last_hit_s", type_=Float), Float)
    return (
        update(entries)
        .where(entries.c.cache == cache, entries.c.key == bindparam("b_key"), entries.c.kind == "entry")
        .values(
            **{name: bindparam(f"b_{name}") for name in AGGREGATES},
            last_used_s=case((and_(hit.is_not(None), hit > entries.c.seen_used_s), hit),
                             else_=entries.c.seen_used_s),
        )
    )


def recompute(s: Session, cache: str, keys: Iterable[str]) -> None:
    """Recompute ``key_stats``, per-row saved seconds and the copies on entry rows for ``keys`` of ``cache``, from
    the keys' usage rows and their compacted history."""
    keys = sorted(set(keys))
    entry_update = entry_update_statement(cache)
    usage = table_of(UsageRow)
    saved_update = (
        update(usage)
        .where(usage.c.cache == cache, usage.c.key == bindparam("b_key"), usage.c.run_id == bindparam("b_run"),
               usage.c.process_index == bindparam("b_process"))
        .values(saved_s=bindparam("b_saved"))
    )
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i : i + _CHUNK]
        by_key: dict[str, list] = {}
        for r in s.execute(select(*USAGE_COLUMNS).join(RunRow, USAGE_JOIN).where(UsageRow.cache == cache,
                                                                         UsageRow.key.in_(chunk))):
            by_key.setdefault(r.key, []).append(r)
        history = histories(s, cache, chunk)
        stats_rows, copies, saved_params = [], [], []
        for key in chunk:
            rows, past = by_key.get(key), history.get(key)
            if rows or past:
                stats, changed = aggregate(rows or [], past)
                stats_rows.append({"cache": cache, "key": key, **stats})
                saved_params += [{"b_key": key, "b_run": run, "b_process": p, "b_saved": v} for run, p, v in changed]
            else:
                stats = EMPTY
            copies.append(entry_params(key, stats))
        s.execute(delete(KeyStatsRow).where(KeyStatsRow.cache == cache, KeyStatsRow.key.in_(chunk)))
        if stats_rows:
            s.execute(insert(KeyStatsRow), stats_rows)
        conn = s.connection()
        if saved_params:
            conn.execute(saved_update, saved_params)
        conn.execute(entry_update, copies)


def copy_to_entries(catalog: Catalog, cache: str, keys: Iterable[str]) -> None:
    """Copy the aggregates of ``keys`` as key_stats holds them now onto their entry rows, in a write transaction of
    the cache: what a storm's batches left for later (on PostgreSQL an entry row's update writes every index of the
    row again, and the same rows were updated by every batch)."""
    keys = sorted(set(keys))
    with catalog.writing(cache) as s:
        update = entry_update_statement(cache)
        for i in range(0, len(keys), _CHUNK):
            chunk = keys[i : i + _CHUNK]
            stats = key_stats(s, cache, chunk)
            s.connection().execute(update, [entry_params(k, stats.get(k, EMPTY)) for k in chunk])


def histories(s: Session, cache: str, keys: list[str]) -> dict[str, dict]:
    """``{key: aggregates}`` of the compacted runs of those of ``keys`` (at most _CHUNK) that have any."""
    cols = [getattr(KeyHistoryRow, n) for n in AGGREGATES]
    return {row[0]: dict(zip(AGGREGATES, row[1:], strict=True)) for row in s.execute(
        select(KeyHistoryRow.key, *cols).where(KeyHistoryRow.cache == cache, KeyHistoryRow.key.in_(keys)))}


def key_stats(s: Session, cache: str, keys: list[str]) -> dict[str, dict]:
    """``{key: aggregates}`` for those of ``keys`` that reports mention (for entry rows a rescan adds)."""
    out: dict[str, dict] = {}
    cols = [getattr(KeyStatsRow, n) for n in AGGREGATES]
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i : i + _CHUNK]
        for row in s.execute(select(KeyStatsRow.key, *cols).where(KeyStatsRow.cache == cache,
                                                                   KeyStatsRow.key.in_(chunk))):
            out[row[0]] = dict(zip(AGGREGATES, row[1:], strict=True))
    return out
