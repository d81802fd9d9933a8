"""The warm-ups pages' data: the API's warm-up queries, in the templates' field names."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from jaxcache.records import JOB
from jaxcache.service.catalog.models import EntryRow, WarmupKeyRow, WarmupRow
from jaxcache.service.catalog.run_tables import RunRow
from jaxcache.service.warmups import queries as catalog_warmups


def _page_fields(w: dict) -> dict:
    return {**w, "finished_at": w["finished_s"], "present": w["already_warm"]}


def list_warmups(state: Any, cache: str) -> list[dict]:
    """The cache's warm-ups, newest first, each with ``hit_since`` (its programs jobs hit after it finished)."""
    with state.catalog.reader() as conn:
        return [_page_fields(w) for w in catalog_warmups.list_warmups(conn, cache, limit=1000)]


def get_warmup(state: Any, cache: str, warmup_id: str) -> dict | None:
    """One warm-up with ``program_list``: status, compile seconds, hits, whether hit since, whether still cached."""
    with state.catalog.reader() as conn:
        found = catalog_warmups.get_warmup(conn, cache, warmup_id)
        if found is None:
            return None
        keys = [k["key"] for k in found["keys"]]
        cached = set(conn.scalars(select(EntryRow.key).where(
            EntryRow.cache == cache, EntryRow.kind == "entry", EntryRow.key.in_(keys)))) if keys else set()
    programs = [{**k, "reason": None, "in_cache": k["key"] in cached} for k in found["keys"]]
    return {**_page_fields(found), "program_list": programs}


def writer_warmup(conn: Any, cache: str, key: str, writer: dict) -> str | None:
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
