"""Per-key aggregates of run records (first writer, hits, last hit, seconds saved) over a key's usage rows (one per
run) and its compacted history, and their copies on entry rows; the seconds saved weighed again when a key's first
writer changes. Seconds saved and retention: docs/service.md, "Run records"."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import BindParameter, Float, and_, bindparam, case, cast, delete, insert, select, update
from sqlalchemy.orm import Session

from jaxcache import records
from jaxcache.service.catalog import rawsql
from jaxcache.service.catalog.models import (
    AGGREGATES,
    EntryRow,
    KeyHistoryRow,
    KeyStatsRow,
    ProcessKeysRow,
    RunRow,
    UsageRow,
    table_of,
)
from jaxcache.service.ingestion import figures as f
from jaxcache.service.ingestion import groups

_CHUNK = 500

EMPTY = {name: None for name in AGGREGATES} | {"hits": 0, "saved_s": 0.0}
WRITER = tuple(n for n in AGGREGATES if n.startswith("writer_"))

#: A usage row with its writer's run row: what aggregates are computed from.
_WRITER_RUN = and_(RunRow.cache == UsageRow.cache, RunRow.run_id == UsageRow.run_id,
                   RunRow.process_index == UsageRow.writer_process)
#: A process's run row with its packed figures (process_keys).
FIGURES_JOIN = and_(ProcessKeysRow.cache == RunRow.cache, ProcessKeysRow.run_id == RunRow.run_id,
                    ProcessKeysRow.process_index == RunRow.process_index)
_ROW_COLUMNS = (UsageRow.key, UsageRow.run_id, UsageRow.job, UsageRow.kind, UsageRow.hits, UsageRow.saved_s,
                UsageRow.last_hit_s, UsageRow.writer_process, UsageRow.writer_at_s, UsageRow.writer_compile_s,
                RunRow.host, RunRow.topology, RunRow.jax, RunRow.jaxlib)


def order(writer: Mapping[str, Any]) -> tuple:
    """Writers compare by time of the write, then run id and process index: every replica and the CLI pick the same
    first writer whatever order records arrive in."""
    return writer["writer_at_s"], writer["writer_run"], writer["writer_process"]


def writer_of(r: Any) -> dict[str, Any] | None:
    """The writer fields of a usage row (with its writer's run columns) whose processes wrote its key."""
    if r.writer_at_s is None:
        return None
    return {"writer_job": r.job, "writer_run": r.run_id, "writer_process": r.writer_process, "writer_host": r.host,
            "writer_topology": r.topology, "writer_jax": r.jax, "writer_jaxlib": r.jaxlib,
            "writer_at_s": r.writer_at_s, "writer_compile_s": r.writer_compile_s}


def earliest(*found: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The writer fields (WRITER) of the first writer among ``found`` (mappings with writer fields, or None)."""
    known = [w for w in found if w is not None and w["writer_run"] is not None]
    return {n: min(known, key=order)[n] for n in WRITER} if known else None


def aggregate(rows: Iterable[Any], history: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Aggregates of one key from its usage rows (with their writers' run columns) and its compacted runs'
    (``history``, a key_history row as a dict). Only jobs' hits count (:func:`figures.used_hits`)."""
    rows = list(rows)
    hits = history["hits"] if history else 0
    last_hit: float | None = history["last_hit_s"] if history else None
    saved = history["saved_s"] if history else 0.0
    for r in rows:
        hits += f.used_hits(r.kind, r.hits)
        saved += r.saved_s
        if r.last_hit_s is not None and (last_hit is None or r.last_hit_s > last_hit):
            last_hit = r.last_hit_s
    writer = earliest(history, *(writer_of(r) for r in rows))
    return {"hits": hits, "last_hit_s": last_hit, "saved_s": saved, **(writer or dict.fromkeys(WRITER))}


def entry_params(key: str, stats: Mapping[str, Any]) -> dict[str, Any]:
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


def store(s: Session, cache: str, stats: Mapping[str, Mapping[str, Any]]) -> None:
    """Write ``stats`` (``{key: aggregates}``) to key_stats, and their copies onto entry rows."""
    keys = sorted(stats)
    conn = s.connection()
    rawsql.upsert_many(conn, table_of(KeyStatsRow), [{"cache": cache, "key": k, **stats[k]} for k in keys])
    rawsql.execute_many(conn, "key-stats-entry-copy", _entry_copy,
                        [{"b_cache": cache, **entry_params(k, stats[k])} for k in keys])


def _entry_copy() -> Any:
    return entry_update_statement(bindparam("b_cache"))


def gather(s: Session, cache: str, keys: Iterable[str], *, reweigh: bool = False) -> dict[str, dict[str, Any]]:
    """The aggregates of ``keys`` from their usage rows and history (EMPTY for a key with neither); with
    ``reweigh``, the seconds saved of every row are weighed again by the key's first writer first."""
    keys = sorted(set(keys))
    out: dict[str, dict[str, Any]] = {}
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i : i + _CHUNK]
        by_key = _rows(s, cache, chunk)
        history = histories(s, cache, chunk)
        if reweigh:
            writers = {k: earliest(history.get(k), *(writer_of(r) for r in by_key.get(k, ()))) for k in chunk}
            if _reweigh(s, cache, {k: w["writer_compile_s"] if w else None for k, w in writers.items()}):
                by_key = _rows(s, cache, chunk)
        for key in chunk:
            rows, past = by_key.get(key), history.get(key)
            out[key] = aggregate(rows or [], past) if rows or past else dict(EMPTY)
    return out


def _rows(s: Session, cache: str, keys: list[str]) -> dict[str, list[Any]]:
    by_key: dict[str, list[Any]] = defaultdict(list)
    for r in s.execute(select(*_ROW_COLUMNS).outerjoin(RunRow, _WRITER_RUN)
                       .where(UsageRow.cache == cache, UsageRow.key.in_(keys))):
        by_key[r.key].append(r)
    return by_key


def _reweigh(s: Session, cache: str, writer_compile_s: Mapping[str, float | None]) -> bool:
    """Weigh the seconds saved by jobs' hits of these keys again (``{key: its first writer's compile seconds}``),
    in every process's figures, usage row and run row; whether any changed."""
    runs: dict[str, set[str]] = defaultdict(set)
    for run_id, key in s.execute(select(UsageRow.run_id, UsageRow.key).where(
            UsageRow.cache == cache, UsageRow.key.in_(list(writer_compile_s)), UsageRow.kind == records.JOB,
            UsageRow.hits > 0)):
        runs[run_id].add(key)
    usage_deltas: dict[tuple[str, str, str], float] = defaultdict(float)
    run_deltas: dict[tuple[str, int], float] = defaultdict(float)
    rewritten: list[dict[str, Any]] = []
    for run_id, keys in sorted(runs.items()):
        for index, job, figures in s.execute(
                select(RunRow.process_index, RunRow.job, ProcessKeysRow.figures)
                .join(ProcessKeysRow, FIGURES_JOIN)
                .where(RunRow.cache == cache, RunRow.run_id == run_id, RunRow.kind == records.JOB)):
            fig = f.decode(figures)
            changed = False
            for i, key in enumerate(fig.keys):
                if key not in keys:
                    continue
                saved = f.saved_of(fig.hits[i], fig.retrieval_s[i], fig.jax_saved_s[i], writer_compile_s[key])
                if saved != fig.saved_s[i]:
                    usage_deltas[(run_id, key, job)] += saved - fig.saved_s[i]
                    run_deltas[(run_id, index)] += saved - fig.saved_s[i]
                    fig.saved_s[i] = saved
                    changed = True
            if changed:
                rewritten.append({"b_run": run_id, "b_process": index, "b_figures": f.encode(fig)})
    if not rewritten:
        return False
    conn = s.connection()
    t = table_of(ProcessKeysRow)
    conn.execute(update(t).where(t.c.cache == cache, t.c.run_id == bindparam("b_run"),
                                 t.c.process_index == bindparam("b_process")).values(figures=bindparam("b_figures")),
                 rewritten)
    u = table_of(UsageRow)
    conn.execute(update(u).where(u.c.cache == cache, u.c.run_id == bindparam("b_run"), u.c.key == bindparam("b_key"),
                                 u.c.job == bindparam("b_job"), u.c.kind == records.JOB)
                 .values(saved_s=u.c.saved_s + bindparam("b_delta", type_=Float)),
                 [{"b_run": r, "b_key": k, "b_job": j, "b_delta": d} for (r, k, j), d in usage_deltas.items()])
    r = table_of(RunRow)
    conn.execute(update(r).where(r.c.cache == cache, r.c.run_id == bindparam("b_run"),
                                 r.c.process_index == bindparam("b_process"))
                 .values(saved_s=r.c.saved_s + bindparam("b_delta", type_=Float)),
                 [{"b_run": run, "b_process": p, "b_delta": d} for (run, p), d in run_deltas.items()])
    return True


def rebuild(s: Session, cache: str, run_id: str, which: set[tuple[str, str, str]] | None = None) -> dict:
    """Rebuild the usage rows of run ``run_id`` (``which``: only those (key, job, kind); None: all) from its
    processes' figures, keeping their parts, programs and explanations; ``{(key, job, kind): row or None}`` as
    they are now (None: no process has the key any more)."""
    parts: dict[tuple[str, str, str], list[groups.Part]] = defaultdict(list)
    for index, job, kind, updated, started, figures in s.execute(
            select(RunRow.process_index, RunRow.job, RunRow.kind, RunRow.updated_s, RunRow.started_s,
                   ProcessKeysRow.figures)
            .join(ProcessKeysRow, FIGURES_JOIN)
            .where(RunRow.cache == cache, RunRow.run_id == run_id)):
        for fig in f.decode(figures).rows():
            ident = (fig[f.KEY], job, kind)
            if which is None or ident in which:
                parts[ident].append((fig, index, updated, started))
    u = table_of(UsageRow)
    where = [u.c.cache == cache, u.c.run_id == run_id]
    existing = {(r.key, r.job, r.kind) for r in s.execute(select(u.c.key, u.c.job, u.c.kind).where(*where))}
    wanted = set(parts) | (existing if which is None else which & existing)
    out: dict = {}
    conn = s.connection()
    for ident in sorted(wanted):
        key, job, kind = ident
        row = groups.build(kind, parts.get(ident, []))
        pk = [u.c.key == key, u.c.job == job, u.c.kind == kind]
        if row is None:
            conn.execute(delete(u).where(*where, *pk))
        elif ident in existing:
            conn.execute(update(u).where(*where, *pk).values(**row))
        else:
            conn.execute(insert(u).values(cache=cache, run_id=run_id, key=key, job=job, kind=kind, counted=0, **row))
        out[ident] = row
    return out


def recompute(s: Session, cache: str, keys: Iterable[str]) -> None:
    """Rebuild the usage rows of ``keys`` of ``cache`` from their processes' figures, weigh their seconds saved by
    the keys' first writers, and recompute key_stats and the copies on entry rows: what ingestion keeps as
    differences must equal this."""
    keys = sorted(set(keys))
    runs: dict[str, set[str]] = defaultdict(set)
    for run_id, key in s.execute(select(UsageRow.run_id, UsageRow.key).where(UsageRow.cache == cache,
                                                                          UsageRow.key.in_(keys))):
        runs[run_id].add(key)
    for run_id, found in sorted(runs.items()):
        idents = {ident for ident in _idents(s, cache, run_id) if ident[0] in found}
        rebuild(s, cache, run_id, idents)
    store(s, cache, gather(s, cache, keys, reweigh=True))


def _idents(s: Session, cache: str, run_id: str) -> set[tuple[str, str, str]]:
    """Every (key, job, kind) a process of ``run_id`` has figures of, and every one it has a row of."""
    out = {(r.key, r.job, r.kind) for r in s.execute(select(UsageRow.key, UsageRow.job, UsageRow.kind).where(
        UsageRow.cache == cache, UsageRow.run_id == run_id))}
    for job, kind, figures in s.execute(
            select(RunRow.job, RunRow.kind, ProcessKeysRow.figures)
            .join(ProcessKeysRow, FIGURES_JOIN)
            .where(RunRow.cache == cache, RunRow.run_id == run_id)):
        out.update((key, job, kind) for key in f.decode(figures).keys)
    return out


def fold(history: Mapping[str, Any] | None, rows: Iterable[tuple[groups.Part, str, str, Mapping[str, Any]]]) -> dict:
    """``history`` with compacted processes' figures of one key added (each a part, its kind, its job and its run's
    writer columns): jobs' hits, the last hit, the seconds saved as the figures hold them (their key's writer's
    measure when they were last weighed), the writer."""
    hits: int = history["hits"] if history else 0
    saved: float = history["saved_s"] if history else 0.0
    last_hit: float | None = history["last_hit_s"] if history else None
    writers: list[Mapping[str, Any] | None] = [history]
    for part, kind, job, run in rows:
        fig = part[groups.FIG]
        used = f.used_hits(kind, fig[f.HITS])
        hits += used
        saved += fig[f.SAVED_S]
        at = f.hit_at(used, fig[f.FIRST_AT], fig[f.LAST_AT])
        if at is not None and (last_hit is None or at > last_hit):
            last_hit = at
        if f.wrote(fig[f.EVENT], fig[f.WRITES]):
            writers.append({"writer_job": job, "writer_run": run["run_id"], "writer_process": part[groups.PROCESS],
                            "writer_host": run["host"], "writer_topology": run["topology"], "writer_jax": run["jax"],
                            "writer_jaxlib": run["jaxlib"], "writer_at_s": fig[f.FIRST_AT] or part[groups.STARTED],
                            "writer_compile_s": fig[f.COMPILE_S]})
    return {"hits": hits, "last_hit_s": last_hit, "saved_s": saved, **(earliest(*writers) or dict.fromkeys(WRITER))}


def histories(s: Session, cache: str, keys: list[str]) -> dict[str, dict]:
    """``{key: aggregates}`` of the compacted runs of those of ``keys`` (at most _CHUNK) that have any."""
    cols = [getattr(KeyHistoryRow, n) for n in AGGREGATES]
    return {row[0]: dict(zip(AGGREGATES, row[1:], strict=True)) for row in s.execute(
        select(KeyHistoryRow.key, *cols).where(KeyHistoryRow.cache == cache, KeyHistoryRow.key.in_(keys)))}


def key_stats(s: Session, cache: str, keys: list[str]) -> dict[str, dict]:
    """``{key: aggregates}`` for those of ``keys`` that reports mention (for entry rows a rescan adds)."""
    return {row[0]: dict(zip(AGGREGATES, row[1:], strict=True)) for row in rawsql.fetch_in(
        s.connection(), "key-stats", _stats_statement, {"cache": cache}, keys)}


def _stats_statement(within: rawsql.Within) -> Any:
    return select(KeyStatsRow.key, *(getattr(KeyStatsRow, n) for n in AGGREGATES)).where(
        KeyStatsRow.cache == bindparam("cache"), within(table_of(KeyStatsRow).c.key))
