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
    """Record ``status`` (a JSON object) as the loop's, replacing what any process said before."""
    now = time.time()
    with catalog.side_write() as s:
        s.execute(catalog.insert(LoopHealthRow).values(loop=loop, status=dict(status), updated_s=now)
                  .on_conflict_do_update(index_elements=["loop"], set_={"status": dict(status), "updated_s": now}))


def read(catalog: Catalog) -> dict[str, dict[str, Any]]:
    """Every loop's last published status, by loop."""
    with catalog.side_reader() as conn:
        return {row.loop: row.status for row in conn.execute(select(LoopHealthRow.loop, LoopHealthRow.status))}
