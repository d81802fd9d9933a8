"""Warm-ups as the catalog holds them, with how many of their programs jobs hit since."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection

from jaxcache.records import JOB
from jaxcache.service.catalog.models import EntryRow, KeyStatsRow, RunRow, WarmupKeyRow, WarmupRow


def _hit_since():
    """Programs of a warm-up that jobs hit after it finished."""
    return (select(func.count()).select_from(WarmupKeyRow)
            .join(KeyStatsRow, and_(KeyStatsRow.cache == WarmupKeyRow.cache, KeyStatsRow.key == WarmupKeyRow.key))
            .where(WarmupKeyRow.cache == WarmupRow.cache, WarmupKeyRow.warmup_id == WarmupRow.id,
                   KeyStatsRow.last_hit_s >= WarmupRow.finished_s)
            .correlate(WarmupRow).scalar_subquery())


def _summary() -> tuple:
    """A warm-up's columns as its summary names them, with how many of its programs jobs hit since."""
    w = WarmupRow
    return (w.id, w.job, w.topology, w.platform, w.gpu_model, w.started_s, w.finished_s, w.programs, w.written,
            w.present.label("already_warm"), w.not_written, w.compile_s, _hit_since().label("hit_since"))


def list_warmups(conn: Connection, cache: str, *, limit: int) -> list[dict]:
    """Newest first, each with how many of its programs jobs have hit since."""
    q = select(*_summary()).where(WarmupRow.cache == cache).order_by(WarmupRow.finished_s.desc()).limit(limit)
    return [r._asdict() for r in conn.execute(q)]


def get_warmup(conn: Connection, cache: str, warmup_id: str) -> dict | None:
    """One warm-up with every program: status, compile seconds, hits reported since, and whether it is cached."""
    row = conn.execute(select(*_summary(), WarmupRow.fingerprint)
                       .where(WarmupRow.cache == cache, WarmupRow.id == warmup_id)).first()
    if row is None:
        return None
    programs = conn.execute(
        select(WarmupKeyRow.key, WarmupKeyRow.function, WarmupKeyRow.status, WarmupKeyRow.compile_s,
               WarmupKeyRow.size_bytes, KeyStatsRow.hits, KeyStatsRow.last_hit_s, EntryRow.key.label("cached"))
        .outerjoin(KeyStatsRow, and_(KeyStatsRow.cache == WarmupKeyRow.cache, KeyStatsRow.key == WarmupKeyRow.key))
        .outerjoin(EntryRow, and_(EntryRow.cache == WarmupKeyRow.cache, EntryRow.key == WarmupKeyRow.key,
                                  EntryRow.kind == "entry"))
        .where(WarmupKeyRow.cache == cache, WarmupKeyRow.warmup_id == warmup_id)
        .order_by(WarmupKeyRow.function, WarmupKeyRow.key)
    ).all()
    return row._asdict() | {"keys": [
        {"key": p.key, "function": p.function, "status": p.status, "compile_s": p.compile_s,
         "size_bytes": p.size_bytes, "hits": p.hits or 0, "last_hit_s": p.last_hit_s,
         "hit_since": p.last_hit_s is not None and p.last_hit_s >= row.finished_s, "in_cache": p.cached is not None}
        for p in programs]}


def writer_warmup(conn: Connection, cache: str, key: str, writer: dict) -> str | None:
    """The id of the writer's first warm-up covering ``key`` (``""`` if none did); None when the writer was a job."""
    return writer_warmups(conn, cache, {key: writer}).get(key)


def writer_warmups(conn: Connection, cache: str, writers: Mapping[str, dict]) -> dict[str, str]:
    """For each key whose first writer (``writers``: key → its ``first_writer`` fields) was a warm-up, the id of that
    warm-up's first run covering the key (``""`` if none did); keys a job wrote are left out. Two reads whatever the
    number of keys (a listing page has up to 1000)."""
    runs = {w["run_id"] for w in writers.values()}
    if not runs:
        return {}
    kinds = {(run, process): kind for run, process, kind in conn.execute(
        select(RunRow.run_id, RunRow.process_index, RunRow.kind)
        .where(RunRow.cache == cache, RunRow.run_id.in_(sorted(runs))))}
    warm = {key: w["job"] for key, w in writers.items()
            if kinds.get((w["run_id"], w["process_index"]), JOB) != JOB}
    if not warm:
        return {}
    out = dict.fromkeys(warm, "")
    for key, job, warmup_id in conn.execute(
        select(WarmupKeyRow.key, WarmupRow.job, WarmupRow.id)
        .join(WarmupRow, (WarmupKeyRow.cache == WarmupRow.cache) & (WarmupKeyRow.warmup_id == WarmupRow.id))
        .where(WarmupRow.cache == cache, WarmupKeyRow.key.in_(sorted(warm)))
        .order_by(WarmupRow.finished_s.desc())  # the first (oldest) of each key's is written last
    ):
        if warm[key] == job:
            out[key] = warmup_id
    return out
