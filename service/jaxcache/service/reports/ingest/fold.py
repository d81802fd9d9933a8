"""Folding run records into the run tables, in the drain's write transaction: a record replaces its process's rows,
then set-based statements (:mod:`.usage`) change the figures of the keys it touched. docs/service.md, "Run records"."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from sqlalchemy import bindparam, delete, func, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache.attestations import FILE, REPORTED, Attestation, from_run
from jaxcache.records import WRITE, RunRecord, machine_of, text_of
from jaxcache.service.catalog import attestations
from jaxcache.service.catalog.database import Catalog, analyze, bulk_insert, dialect_insert
from jaxcache.service.catalog.models import CacheRow, ProcessKeysRow, RunRow, UsageRow, table_of
from jaxcache.service.catalog.usage import is_miss
from jaxcache.service.metrics import REPORT
from jaxcache.service.reports.ingest import misses, usage
from jaxcache.service.reports.ingest.usage import EXPLANATION, chunks

__all__ = ["Folded", "Item", "fold"]

_pk, _runs, _usage = table_of(ProcessKeysRow), table_of(RunRow), table_of(UsageRow)
#: A process_keys row, as fold writes it: the record's KeyUsage fields (its saved_s is JAX's figure).
_COLUMNS = ("cache", "run_id", "process_index", "key", "function", "event", "hits", "compiles", "writes", "reason",
            "compile_s", "retrieval_s", "jax_saved_s", "size_bytes", "first_at", "last_at")
#: What a miss's explanation reads of its row's representative run: a process that moved these drops it.
RUN_INPUTS = ("fingerprint_digest", "topology", "started_s")


@dataclass(frozen=True, slots=True)
class Item:
    """A record to fold (a RunRecord or the inbox's RunFigures), its source (REPORT or STORAGE), a file's name."""

    record: RunRecord | Any
    source: str
    name: str | None = None


@dataclass(slots=True)
class Folded:
    """Records that changed the catalog (by source), stale ones, and misses explained for the first time (by cause)."""

    fresh: Counter[str] = field(default_factory=Counter)
    stale: int = 0
    misses: Counter[str] = field(default_factory=Counter)


def fold(catalog: Catalog, s: Session, cache: str, items: Sequence[Item], *,
         root: str | None = None) -> Folded:
    """Fold ``items`` (one a process at most) and their digests into ``cache``'s run tables in ``s``, a transaction of
    ``catalog.writing(cache)``; a record older than its process's row or the compaction watermark is stale."""
    conn = s.connection()
    out = Folded()
    held = _held(conn, cache, items)
    watermark = conn.execute(select(CacheRow.compacted_before_s).where(CacheRow.name == cache)).scalar()
    fresh: dict[tuple[str, int], Item] = {}
    found: list[Attestation] = []
    for item in items:
        r = item.record
        pid = (r.run_id, r.process_index)
        before = held.get(pid)
        if before is not None and before["updated_s"] > r.updated_at:
            out.stale += 1
            continue
        if before is None and watermark is not None and r.updated_at < watermark:
            out.stale += 1  # its run may be in key_history already
        else:
            fresh[pid] = item
            out.fresh[item.source] += 1
        # Recorded for stale records too: digests are evidence, and a back-dated record must not hide a forged one.
        found += _attestations(item)
    if fresh:
        out.misses = _fold_fresh(conn, cache, fresh, held, root)
    if found:
        attestations.record_in(catalog, s, cache, found)
    return out


def _held(conn: Connection, cache: str, items: Sequence[Item]) -> dict[tuple[str, int], dict[str, Any]]:
    """What the catalog holds of the items' processes' run rows."""
    pairs = sorted({(i.record.run_id, i.record.process_index) for i in items})
    cols = ("run_id", "process_index", "updated_s", *RUN_INPUTS)
    held = select(*(_runs.c[n] for n in cols)).where(_runs.c.cache == cache, *usage.of_processes(_runs))
    return {(row.run_id, row.process_index): row._asdict() for params in usage.process_params(pairs)
            for row in conn.execute(held, params)}


def _fold_fresh(conn: Connection, cache: str, fresh: dict[tuple[str, int], Item],
                held: dict[tuple[str, int], dict[str, Any]], root: str | None) -> Counter[str]:
    """Replace the fresh records' processes and compute their keys' figures again; the misses counted for the metric."""
    touched: dict[str, set[str]] = defaultdict(set)
    for (run_id, _), item in fresh.items():
        touched[run_id].update(u.key for u in item.record.keys)
    pairs = sorted(fresh)
    usage.usage_before(conn, cache, pairs)
    replaced = delete(_pk).where(_pk.c.cache == cache, *usage.of_processes(_pk)).returning(_pk.c.key)
    for params in usage.process_params(pairs):
        touched[params["b_run"]].update(conn.execute(replaced, params).scalars())
    now = time.time()
    rows = {pid: _run_row(cache, item, now) for pid, item in fresh.items()}
    conn.execute(_upsert(conn, _runs), list(rows.values()))
    bulk_insert(conn, _pk, _COLUMNS, [
        (cache, r.run_id, r.process_index, u.key, u.function, u.event, u.hits, u.compiles, u.writes, u.reason,
         u.compile_s, u.retrieval_s, u.saved_s, u.size_bytes, u.first_at, u.last_at)
        for item in fresh.values() for r in [item.record] for u in r.keys])
    if {run for run, _ in fresh} - {run for run, _ in held}:
        # A bulk load: without fresh statistics the planner (SQLite's above all) scans the cache's rows.
        analyze(conn, ("runs", "process_keys"))
    # A row's explanation also reads its representative process's run: one that moved takes it with it.
    moved = [{"b_run": run_id, "b_process": index} for (run_id, index), row in rows.items()
             if (before := held.get((run_id, index))) is not None and any(row[n] != before[n] for n in RUN_INPUTS)]
    if moved:
        u = _usage.c
        conn.execute(update(_usage).where(u.cache == cache, u.run_id == bindparam("b_run"),
                                          u.process_index == bindparam("b_process"))
                     .values({n: None for n in EXPLANATION}), moved)
    keys = sorted({k for found in touched.values() for k in found})
    for run_id, found in sorted(usage.usage_after(conn, cache, pairs).items()):
        usage.usage_rows(conn, cache, list(found), run_id=run_id)
    _texts(conn, cache, fresh.values(), touched)
    reweigh = usage.key_stats(conn, cache, keys)
    usage.process_saved(conn, cache, processes=pairs)
    if reweigh:
        usage.refresh(conn, cache, sorted(reweigh))
    return _misses(conn, cache, touched, root)


def _upsert(conn: Connection, table: Any) -> Any:
    """An upsert of whole rows of ``table`` on its primary key."""
    ins = dialect_insert(conn.dialect.name, table)
    key = [c.name for c in table.primary_key]
    return ins.on_conflict_do_update(index_elements=key, set_={
        c.name: ins.excluded[c.name] for c in table.columns if c.name not in key})


def _run_row(cache: str, item: Item, now: float) -> dict[str, Any]:
    record = item.record
    fp = record.fingerprint
    return {
        "cache": cache, "run_id": record.run_id, "process_index": record.process_index, "job": record.job,
        "process_count": record.process_count, "host": record.host, "topology": record.topology,
        "cache_dir": record.cache_dir, "jax": fp.jax, "jaxlib": fp.jaxlib, "backend": fp.backend,
        "fingerprint": msgspec.to_builtins(fp), "fingerprint_digest": fp.digest, "started_s": record.started_at,
        "updated_s": record.updated_at, "final": record.final, "pid": record.pid, "keys": len(record.keys),
        "source": item.source, "ingested_s": now, "kind": record.kind,
        "hits": sum(u.hits for u in record.keys), "compiles": sum(u.compiles for u in record.keys),
        "writes": sum(u.writes for u in record.keys), "saved_s": 0.0, "saved_writer_s": 0.0,  # usage.process_saved
        "local": None if record.local is None else msgspec.to_builtins(record.local),
        "machine": machine_of(fp, record.cpus),
    }


def _texts(conn: Connection, cache: str, items: Any, touched: dict[str, set[str]]) -> None:
    """Give usage rows that lack them their key's parts and program from the first record that carries them,
    dropping the explanation made without them."""
    c = _usage.c
    lacking: dict[str, set[tuple[str, str, str, str]]] = {"parts": set(), "program": set()}
    for run_id, found in sorted(touched.items()):
        for chunk in chunks(sorted(found)):
            for job, kind, key, no_parts, no_program in conn.execute(
                    select(c.job, c.kind, c.key, c.parts.is_(None), c.program.is_(None)).where(
                        c.cache == cache, c.run_id == run_id, c.key.in_(chunk),
                        or_(c.parts.is_(None), c.program.is_(None)))):
                for column, lacks in (("parts", no_parts), ("program", no_program)):
                    if lacks:
                        lacking[column].add((run_id, job, kind, key))
    for column, rows in lacking.items():
        first: dict[tuple[str, str, str, str], Any] = {}
        for item in items if rows else ():
            r = item.record
            for u in r.keys:
                row = (r.run_id, r.job, r.kind, u.key)
                if row in rows and row not in first and (value := text_of(u, column)) is not None:
                    first[row] = value
        if not first:
            continue
        statement = (update(_usage).where(c.cache == cache, c.run_id == bindparam("b_run"),
                                          c.job == bindparam("b_job"), c.kind == bindparam("b_kind"),
                                          c.key == bindparam("b_key"), c[column].is_(None))
                     .values({column: bindparam("b_value", type_=c[column].type),
                              **{n: None for n in EXPLANATION}}))
        conn.execute(statement, [{"b_run": run, "b_job": job, "b_kind": kind, "b_key": key, "b_value": value}
                                 for (run, job, kind, key), value in first.items()])


def _misses(conn: Connection, cache: str, touched: dict[str, set[str]], root: str | None) -> Counter[str]:
    """Explain the touched rows' new misses; count for the metric those that joined an explained row and those
    explained now."""
    c = _usage.c
    counts: Counter[str] = Counter()
    pending: list[misses.Pending] = []
    for run_id, found in sorted(touched.items()):
        for chunk in chunks(sorted(found)):
            mine = [c.cache == cache, c.run_id == run_id, c.key.in_(chunk)]
            joined = [*mine, c.cause.is_not(None), c.missed > c.counted]
            counts.update({cause: int(n) for cause, n in conn.execute(
                select(c.cause, func.sum(c.missed - c.counted)).where(*joined).group_by(c.cause))})
            conn.execute(update(_usage).where(*joined).values(counted=c.missed))
            pending += [misses.Pending(*row) for row in conn.execute(
                select(c.run_id, c.job, c.key).where(*mine, is_miss(c.kind, c.event), c.cause.is_(None)))]
    if pending:
        counts.update(misses.explain_pending(conn, cache, pending, root=root))
    return counts


def _attestations(item: Item) -> list[Attestation]:
    record = item.record
    digests = [u for u in record.keys if u.sha256 and u.event == WRITE]
    if not digests:
        return []
    # A POSTed digest came with a report token; a file's is worth what the bucket's writers are.
    kind = REPORTED if item.source == REPORT else FILE
    return list(from_run(msgspec.structs.replace(record, keys=digests), source=kind, at=time.time(),
                         record=item.name))
