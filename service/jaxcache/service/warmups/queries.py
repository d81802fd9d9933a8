"""Warm-ups as the catalog holds them, with how many of their programs jobs hit since."""

from __future__ import annotations

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache.records import JOB
from jaxcache.service.catalog.models import EntryRow, KeyStatsRow, RunRow, WarmupKeyRow, WarmupRow


def _hit_since():
    """Programs of a warm-up that jobs hit after it finished."""
    return (select(func.count()).select_from(WarmupKeyRow)
            .join(KeyStatsRow, and_(KeyStatsRow.cache == WarmupKeyRow.cache, KeyStatsRow.key == WarmupKeyRow.key))
            .where(WarmupKeyRow.cache == WarmupRow.cache, WarmupKeyRow.warmup_id == WarmupRow.id,
                   KeyStatsRow.last_hit_s >= WarmupRow.finished_s)
            .correlate(WarmupRow).scalar_subquery())


def list_warmups(conn: Connection, cache: str, *, limit: int) -> list[dict]:
    """Newest first, each with how many of its programs jobs have hit since."""
    q = (select(WarmupRow, _hit_since().label("hit_since")).where(WarmupRow.cache == cache)
         .order_by(WarmupRow.finished_s.desc()).limit(limit))
    return [_summary(row, hit_since) for row, hit_since in _rows(conn, q)]


def get_warmup(conn: Connection, cache: str, warmup_id: str) -> dict | None:
    """One warm-up with every program: status, compile seconds, hits reported since, and whether it is cached."""
    found = list(_rows(conn, select(WarmupRow, _hit_since().label("hit_since"))
                       .where(WarmupRow.cache == cache, WarmupRow.id == warmup_id)))
    if not found:
        return None
    row, hit_since = found[0]
    programs = conn.execute(
        select(WarmupKeyRow.key, WarmupKeyRow.function, WarmupKeyRow.status, WarmupKeyRow.compile_s,
               WarmupKeyRow.size_bytes, KeyStatsRow.hits, KeyStatsRow.last_hit_s, EntryRow.key.label("cached"))
        .outerjoin(KeyStatsRow, and_(KeyStatsRow.cache == WarmupKeyRow.cache, KeyStatsRow.key == WarmupKeyRow.key))
        .outerjoin(EntryRow, and_(EntryRow.cache == WarmupKeyRow.cache, EntryRow.key == WarmupKeyRow.key,
                                  EntryRow.kind == "entry"))
        .where(WarmupKeyRow.cache == cache, WarmupKeyRow.warmup_id == warmup_id)
        .order_by(WarmupKeyRow.function, WarmupKeyRow.key)
    ).all()
    return _summary(row, hit_since) | {"fingerprint": row.fingerprint, "keys": [
        {"key": p.key, "function": p.function, "status": p.status, "compile_s": p.compile_s,
         "size_bytes": p.size_bytes, "hits": p.hits or 0, "last_hit_s": p.last_hit_s,
         "hit_since": p.last_hit_s is not None and p.last_hit_s >= row.finished_s, "in_cache": p.cached is not None}
        for p in programs]}


def _rows(conn: Connection, q):
    with Session(bind=conn) as s:
        yield from s.execute(q).all()


def _summary(row: WarmupRow, hit_since: int | None) -> dict:
    return {
        "id": row.id, "job": row.job, "topology": row.topology, "platform": row.platform,
        "gpu_model": row.gpu_model, "started_s": row.started_s, "finished_s": row.finished_s,
        "programs": row.programs, "written": row.written, "already_warm": row.present,
        "not_written": row.not_written, "compile_s": row.compile_s, "hit_since": hit_since or 0}


def writer_warmup(conn: Connection, cache: str, key: str, writer: dict) -> str | None:
    """The id of the writer's first warm-up covering ``key`` (``""`` if none did); None when the writer was a job."""
    kind = conn.scalar(select(RunRow.kind).where(RunRow.cache == cache, RunRow.run_id == writer["run_id"],
                                                 RunRow.process_index == writer["process_index"]))
    if kind in (None, JOB):
        return None
    found = conn.scalar(select(WarmupRow.id).join(WarmupKeyRow, (WarmupKeyRow.cache == WarmupRow.cache)
                                                  & (WarmupKeyRow.warmup_id == WarmupRow.id))
                        .where(WarmupRow.cache == cache, WarmupRow.job == writer["job"], WarmupKeyRow.key == key)
                        .order_by(WarmupRow.finished_s).limit(1))
    return found or ""
