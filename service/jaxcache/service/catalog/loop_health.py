"""The background loops' health in the catalog (``loop_health``): the process that runs a loop's pass writes how it
is doing, and every process of every replica reads it, so that any ``/readyz`` and ``/metrics`` show every loop
whichever process runs it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select

from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import LoopHealthRow


def publish(catalog: Catalog, loop: str, status: Mapping[str, Any]) -> None:
    """Record ``status`` (a JSON object) as the loop's, replacing what any process said before, except its history:
    the last success and the last error stay those of whichever process had them last. Each process knows only
    its own passes, and one whose first pass starts after another's success must not hide that success."""
    now = time.time()
    with catalog.writing(f"loop {loop}") as s:  # SQLite: BEGIN IMMEDIATE, as it reads then writes
        row = s.execute(select(LoopHealthRow.status).where(LoopHealthRow.loop == loop).with_for_update()).first()
        merged = _with_history(dict(status), row.status if row is not None else {})
        s.execute(catalog.insert(LoopHealthRow).values(loop=loop, status=merged, updated_s=now)
                  .on_conflict_do_update(index_elements=["loop"], set_={"status": merged, "updated_s": now}))


def _with_history(status: dict[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    if (before.get("last_success_s") or 0) > (status.get("last_success_s") or 0):
        status["last_success_s"] = before["last_success_s"]
    if (before.get("last_error_s") or 0) > (status.get("last_error_s") or 0):
        status["last_error_s"], status["last_error"] = before["last_error_s"], before.get("last_error")
    return status


def read(catalog: Catalog) -> dict[str, dict[str, Any]]:
    """Every loop's last published status, by loop."""
    with catalog.reader() as conn:
        return {row.loop: row.status for row in conn.execute(select(LoopHealthRow.loop, LoopHealthRow.status))}
