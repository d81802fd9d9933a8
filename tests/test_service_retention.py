"""Retention of run records (JAXCACHE_RECORDS_RETAIN_D): runs older than it are compacted into per-key history and
their files deleted, and every per-key figure (aggregates, entry rows, hit_since, prune candidates) is exactly what
it was; a compacted record read or POSTed again changes nothing. SQLite and PostgreSQL catalogs."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from conftest import settled
from jaxcache import records
from jaxcache.service.app import create_app
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import (
    AGGREGATES,
    CacheRow,
    EntryRow,
    KeyHistoryRow,
    KeyStatsRow,
    PruneItemRow,
    PruneRow,
    RecordFileRow,
    RunRow,
    UsageRow,
    WarmupKeyRow,
    WarmupRow,
)
from jaxcache.service.prune.candidates import catalog_candidates
from jaxcache.service.reports.ingest import queue
from jaxcache.service.reports.ingest.usage import refresh
from jaxcache.service.reports.records import runfiles
from jaxcache.service.rounds import rescan
from jaxcache.service.warmups import queries as coverage
from jaxcache.storage import open_storage
from reports_support import DAY, H_ADMIN, H_READ, age, hit, put_record, run, settings, write

RETAIN = 30 * DAY
# Whole and binary-fraction seconds: sums of them are exact in any order, so "unchanged" can be equality.
T0 = float(int(time.time()) - 60 * 86400)


def _old_and_new(keys: dict[str, str]) -> tuple[list[records.RunRecord], list[records.RunRecord]]:
    """Runs 40-50 days old (compacted) and recent ones (kept), over the same keys."""
    train, tiny, odd = keys["jit_train_step"], keys["jit_tiny"], keys["jit_odd-name.v2"]
    old = [
        run("pretrain", "w1", [write(train, 12.5, T0), write(tiny, 0.5, T0 + 1)], at=T0 + 100, jaxlib="0.9"),
        run("eval", "e1", [hit(train, 3, T0 + 300, retrieval_s=0.25), hit(odd, 2, T0 + 200, saved_s=2.0)],
            at=T0 + 10 * DAY),
        run("eval", "e1", [hit(tiny, 4, T0 + 500, retrieval_s=0.5)], at=T0 + 10 * DAY, process_index=1,
            process_count=2),
        run("warm", "v1", [hit(train, 9, T0 + 600)], at=T0 + 10 * DAY, kind=records.WARMUP_VERIFY),
    ]
    now = time.time()
    new = [
        run("finetune", "f1", [hit(train, 5, now - 2 * DAY, retrieval_s=0.75), write(odd, 4.0, now - 3 * DAY)],
            at=now - DAY),
        run("finetune", "f2", [hit(tiny, 1, T0 + 200)], at=now - 3600),  # a last hit older than the history's
    ]
    return old, new


def _snapshot(catalog: Catalog, cache: str) -> dict:
    """Every per-key figure compaction must leave as it was."""
    with catalog.reader() as conn:
        stats = {r[0]: tuple(r[1:]) for r in conn.execute(
            select(KeyStatsRow.key, *(getattr(KeyStatsRow, n) for n in AGGREGATES)).where(KeyStatsRow.cache == cache))}
        entries = {r[0]: tuple(r[1:]) for r in conn.execute(
            select(EntryRow.key, EntryRow.last_used_s, *(getattr(EntryRow, n) for n in AGGREGATES))
            .where(EntryRow.cache == cache))}
        warmups = [(w["id"], w["hit_since"]) for w in coverage.list_warmups(conn, cache, limit=100)]
        detail = coverage.get_warmup(conn, cache, "wu1")
    candidates = sorted((c.key, c.last_hit_s, c.writer_jaxlib, c.last_use_s)
                        for c in catalog_candidates(catalog, cache))
    assert detail is not None
    return {"stats": stats, "entries": entries, "warmups": warmups, "warmup_keys": detail["keys"],
            "candidates": candidates}


def _count(catalog: Catalog, model) -> int:
    with catalog.reader() as conn:
        return conn.execute(select(func.count()).select_from(model)).scalar_one()


@pytest.fixture
def compacted(catalog_url, cache_copy, keys):
    """A catalog over a copy of the real cache, with old and new runs ingested from their files, a warm-up, an old
    malformed record and an old prune audit; snapshot before compaction, and compaction's result."""
    age(cache_copy, 45)
    catalog = Catalog(catalog_url)
    storage = open_storage(str(cache_copy))
    with catalog.session() as s:
        s.add(CacheRow(name="demo", url=storage.url))
        s.add(WarmupRow(cache="demo", id="wu1", job="warm", topology="1x1x1", platform="cpu", gpu_model=None,
                        started_s=T0 + 250, finished_s=T0 + 350, fingerprint={}, programs=3, written=3, present=0,
                        not_written=0, compile_s=13.0))
        for key in (keys["jit_train_step"], keys["jit_tiny"], keys["jit_odd-name.v2"]):
            s.add(WarmupKeyRow(cache="demo", warmup_id="wu1", key=key, function=key.rsplit("-", 1)[0],
                               status="written", compile_s=1.0, size_bytes=1))
        s.add(PruneRow(id=1, cache="demo", at_s=T0, who="me", policy={}, deleted=1, bytes_freed=1, already_gone=0,
                       changed=0, errors=[], planned=1, planned_bytes=1, state="done"))
        s.add(PruneRow(id=2, cache="demo", at_s=time.time(), who="me", policy={}, deleted=1, bytes_freed=1,
                       already_gone=0, changed=0, errors=[], planned=1, planned_bytes=1, state="done"))
        s.add_all([PruneItemRow(prune_id=i, name=f"x{i}-cache", key=f"x{i}", size_bytes=1) for i in (1, 2)])
    old, new = _old_and_new(keys)
    paths = [put_record(cache_copy, r) for r in old + new]
    bad = cache_copy / records.RUNS_PREFIX / records.day_of(T0) / "broken-p0.json"
    bad.write_text("{")
    for p in [*paths[: len(old)], bad]:
        os.utime(p, (T0 + 10 * DAY, T0 + 10 * DAY))
    first = rescan(catalog, "demo", storage)  # no retention: ingests everything
    assert (first.records_ingested, first.records_malformed, first.records_compacted) == (len(old) + len(new), 1, 0)
    before = _snapshot(catalog, "demo")
    result = rescan(catalog, "demo", storage, retain_s=RETAIN)
    yield SimpleNamespace(catalog=catalog, storage=storage, root=cache_copy, keys=keys, old=old, new=new,
                          paths=paths, bad=bad, before=before, result=result)
    catalog.dispose()


def test_compaction_leaves_every_per_key_figure_unchanged(compacted):
    c = compacted
    catalog, keys, old, new, before = c.catalog, c.keys, c.old, c.new, c.before
    assert c.result.records_compacted == len(old)
    assert _snapshot(catalog, "demo") == before
    # The figures are the ones of every record, compacted or not: jobs' hits only (not the verify run's 9), the
    # old writer first, seconds saved by its measure.
    train = before["stats"][keys["jit_train_step"]]
    assert dict(zip(AGGREGATES, train, strict=True)) == {
        "hits": 3 + 5, "last_hit_s": new[0].keys[0].last_at, "saved_s": 3 * 12.5 - 0.25 + 5 * 12.5 - 0.75,
        "writer_job": "pretrain", "writer_run": "w1", "writer_process": 0, "writer_host": "node-1",
        "writer_topology": "1x1x1", "writer_jax": "0.9", "writer_jaxlib": "0.9", "writer_at_s": T0,
        "writer_compile_s": 12.5, "writer_machine": "cpu",
        # The writer was a job: its compile is the platform's own measure too.
        "platform_compile_s": 12.5, "platform_machine": "cpu", "platform_at_s": T0}
    assert before["warmups"] == [("wu1", 2)]  # train (hit since by f1) and tiny (by e1; f2's hit is older)
    # Only the recent runs are left as runs; the old ones' figures live on in key_history.
    with catalog.reader() as conn:
        assert set(conn.execute(select(RunRow.run_id, RunRow.process_index))) == {("f1", 0), ("f2", 0)}
        assert set(conn.scalars(select(UsageRow.run_id).distinct())) == {"f1", "f2"}
        history = {r.key: r for r in conn.execute(select(KeyHistoryRow))}
        assert conn.scalar(select(CacheRow.compacted_before_s)) == pytest.approx(time.time() - RETAIN, abs=60)
        assert set(conn.scalars(select(PruneItemRow.prune_id))) == {2}  # the old audit's items; its row stays
        assert conn.scalar(select(func.count()).select_from(PruneRow)) == 2
        files = set(conn.scalars(select(RecordFileRow.name)))
    assert history[keys["jit_train_step"]].hits == 3 and history[keys["jit_train_step"]].writer_run == "w1"
    assert history[keys["jit_odd-name.v2"]].writer_run is None  # its writer, f1, is recent
    # The service deleted the old records and the old malformed one; the recent ones stay.
    assert [p.exists() for p in c.paths] == [False] * len(old) + [True] * len(new)
    assert not c.bad.exists()
    assert files == {r.name for r in new}
    # A later pass finds nothing more to do, and changes nothing.
    again = rescan(catalog, "demo", c.storage, retain_s=RETAIN)
    assert again.records_compacted == 0 and _snapshot(catalog, "demo") == before


def test_recomputing_adds_the_history_back(compacted):
    catalog, keys, before = compacted.catalog, compacted.keys, compacted.before
    every = list(before["stats"])
    with catalog.writing("demo") as s:
        refresh(s.connection(), "demo", every)
    assert _snapshot(catalog, "demo") == before  # key_stats from key_history + the live rows, as they were
    # A new record on a key adds to what history holds, whichever way its aggregates are updated.
    train, tiny = keys["jit_train_step"], keys["jit_tiny"]
    queue.ingest(catalog, "demo", run("finetune", "f3", [hit(train, 2, time.time() - 10, retrieval_s=0.5),
                                                           write(tiny, 0.25, T0 - DAY)]))
    after = _snapshot(catalog, "demo")["stats"]
    hits, saved = AGGREGATES.index("hits"), AGGREGATES.index("saved_s")
    assert after[train][hits] == before["stats"][train][hits] + 2
    assert after[train][saved] == before["stats"][train][saved] + 2 * 12.5 - 0.5
    # f3 wrote tiny before the compacted writer did: it is the first writer now, and hits keep counting.
    assert after[tiny][AGGREGATES.index("writer_run")] == "f3"
    assert after[tiny][hits] == before["stats"][tiny][hits]


def test_a_compacted_record_read_or_posted_again_changes_nothing(compacted):
    c = compacted
    for record in c.old:
        assert queue.ingest(c.catalog, "demo", record).stale
    # Its file put back as it was (a restore from a backup): the next full listing reads it, and it is stale too.
    path = put_record(c.root, c.old[1])
    os.utime(path, (T0 + 10 * DAY, T0 + 10 * DAY))
    runfiles.listings(c.catalog).clear()  # as a process's first rescan
    again = rescan(c.catalog, "demo", c.storage, retain_s=RETAIN)
    assert again.records_ingested == 1 and again.records_compacted == 0
    assert _snapshot(c.catalog, "demo") == c.before
    assert _count(c.catalog, RunRow) == len(c.new)
    # Older than the horizon, and no run of the catalog's is in it: the service deletes it.
    assert not path.exists()


def test_stale_jaxlib_window_beyond_the_retention_is_refused(tmp_path, cache_copy):
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, records_retain_d=7))) as client:
        settled(client)
        for body, headers in (({"stale_jaxlib": True}, H_READ),  # the default window, 14d
                              ({"stale_jaxlib": True, "stale_jaxlib_window": "8d", "dry_run": False}, H_ADMIN)):
            r = client.post("/v1/caches/demo/prune", json=body, headers=headers)
            assert r.status_code == 400, r.text
            assert "JAXCACHE_RECORDS_RETAIN_D=7" in r.json()["detail"] and "at most 7d" in r.json()["detail"]
        r = client.post("/v1/caches/demo/prune", json={"stale_jaxlib": True, "stale_jaxlib_window": "7d"},
                        headers=H_READ)
        assert r.status_code == 200, r.text


def test_the_service_compacts_at_its_rescans_and_counts_them(tmp_path, cache_copy, keys):
    old, _ = _old_and_new(keys)
    for r in old:
        put_record(cache_copy, r)
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}))) as client:
        settled(client)  # its first rescan ingested the old records (no watermark yet), then compacted them
        metrics = client.get("/metrics").text
        assert f'jaxcache_records_compacted_total{{cache="demo"}} {float(len(old))}' in metrics
        assert client.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"] == []
        e = client.get(f"/v1/caches/demo/entries/{keys['jit_train_step']}", headers=H_READ).json()
        assert e["hits"] == 3 and e["first_writer"]["run_id"] == "w1"
        r = client.post("/v1/caches/demo/rescan", headers=H_ADMIN).json()
        assert r["records_compacted"] == 0 and r["records_ingested"] == 0
    assert not any((cache_copy / records.RUNS_PREFIX).rglob("*.json"))

