"""The planner's statistics, gathered after bulk loads, reach every connection. On SQLite, ANALYZE loads what it
writes into the connection that ran it only; another one kept planning with what it had read before, and kept its
cached statements' plans: in a report storm, a drain pass on such a connection read each process's rows by scanning
the cache's, and took thirty times as long as the others. On PostgreSQL, the entries a rescan loads are analyzed
at once: with an empty table's statistics every listing page sorted all of the cache's rows (bench/README.md,
"Statistics every connection plans with"). Work is counted in steps of SQLite's virtual machine (a progress
handler) or read from the planner's own figures, not timed."""

from __future__ import annotations

import time
from collections import Counter

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, text

from conftest import settled
from jaxcache.service.app import create_app
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.reports.ingest import queue
from reports_support import hit, run, settings

PROCESSES, KEYS, PASS = 256, 50, 64
#: Virtual machine instructions between two calls of the progress handler.
STEP = 1000


def _job(final: bool) -> list:
    """A job's records: each process's first record (a fifth of its keys), or its last (every key), which replaces
    the first."""
    at = time.time() - (60 if final else 600)
    keys = KEYS if final else KEYS // 5
    return [run("storm", "r1", [hit(f"jit_step{k}-{k:064x}", 1, at) for k in range(keys)], at=at,
                process_index=p, process_count=PROCESSES) for p in range(PROCESSES)]


def _fold(passes: list[tuple[Catalog, int]], records: list, steps: Counter) -> list[int]:
    """Put ``records`` into the inbox and drain them, a pass of each (catalog, size) of ``passes`` in turn, the
    catalog taking it; each pass's steps."""
    spent, done = [], 0
    for catalog, size in passes:
        for record in records[done:done + size]:
            queue.accept(catalog, "demo", record, record.to_json())
        done += size
        before = steps["n"]
        queue.drain(catalog, "demo")
        spent.append(steps["n"] - before)
    return spent


def test_every_connection_plans_a_drain_pass_with_the_statistics_the_last_analyze_wrote(tmp_path):
    # Two processes' catalogs on one file (replicas, or uvicorn's workers), each writing on a connection of its own.
    early, late = (Catalog(f"sqlite:///{tmp_path}/catalog.sqlite") for _ in range(2))
    steps: Counter = Counter()

    def counting(dbapi_conn, _record, _proxy) -> None:
        dbapi_conn.set_progress_handler(lambda: steps.update(n=1), STEP)

    try:
        for catalog in (early, late):
            event.listen(catalog.write_engine, "checkout", counting)  # where the drain's passes run
        # The drain wakes at the storm's first record: the new run's first pass is small, and analyzed; here one
        # process takes it, and the other the rest of the run's first records, analyzed as they come.
        _fold([(early, 2), *[(late, PASS)] * 4], _job(final=False), steps)
        final = _fold([(early, PASS), (late, PASS)] * 2, _job(final=True), steps)
    finally:
        early.dispose()
        late.dispose()
    # Equal passes over the same keys: about equal work, whichever process's connection each ran on.
    assert max(final) < 2 * min(final), final


def test_postgresqls_planner_knows_how_many_entries_the_first_scan_loaded(pg_url, tmp_path, cache_copy):
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, db=pg_url))) as client:
        settled(client)
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT count(*) FROM entries")).scalar_one()
            # What the planner takes the table's size to be: -1 until the table is first analyzed.
            planned = conn.execute(text("SELECT reltuples FROM pg_class WHERE relname = 'entries'")).scalar_one()
    finally:
        engine.dispose()
    assert rows > 0 and planned == rows
