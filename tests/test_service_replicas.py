"""Several replicas of the service on one catalog: the cross-replica locks (a PostgreSQL advisory lock, a file lock
beside an SQLite file), report ingestion from two replicas at once, and two real `jaxcache serve` processes over
one cache root: the same listing from both, one prune at a time, and a killed lock holder handing over.

Nothing here waits for a time to pass: where a test needs a prune to be in flight, it holds the rescan lock that the
prune must take (as a third replica would), so the prune stays in flight until the test lets go.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, func, select, update
from sqlalchemy.engine import make_url

from conftest import kill_service, serve_env, start_serve, stop_serve, wait_ready
from jaxcache.records import RunRecord
from jaxcache.service.catalog.coordination import ClusterLocks, LockBusyError
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import CacheRow, EntryRow, KeyStatsRow, UsageRow
from jaxcache.service.reports.ingest import queue
from jaxcache.service.reports.ingest.usage import refresh
from jaxcache.service.reports.records.root_change import register
from jaxcache.service.rounds import ensure_scanned, rescan
from jaxcache.service.state import State
from jaxcache.storage import open_storage
from reports_support import hit, keys_of, run, settings, write

ADMIN, REPORT = "replica-admin-token", "replica-report-token"
H_ADMIN, H_REPORT = {"Authorization": f"Bearer {ADMIN}"}, {"Authorization": f"Bearer {REPORT}"}
#: Bound on waits for something another process does (start, release a dead holder's lock); never asserted on.
PATIENCE_S = 120


# --------------------------------------------------------------------------------------------------------------
# Locks


def test_a_lock_excludes_other_replicas_and_threads(catalog_url):
    one, two = ClusterLocks(make_url(catalog_url)), ClusterLocks(make_url(catalog_url))
    try:
        a, b = one.get("prune:demo"), two.get("prune:demo")
        assert a.acquire(blocking=False)
        assert not b.acquire(blocking=False)
        assert not b.acquire(timeout=0.2)  # a bounded wait gives up
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(a.acquire(blocking=False)))  # another thread, same replica
        thread.start()
        thread.join()
        assert got == [False]
        assert two.get("scan:demo").acquire(blocking=False)  # other names are other locks
        two.get("scan:demo").release()
        a.release()
        assert b.acquire(blocking=False)
        b.release()
    finally:
        one.dispose()
        two.dispose()


_HOLDER = """
import sys, time
from sqlalchemy.engine import make_url
from jaxcache.service.catalog.coordination import ClusterLocks
lock = ClusterLocks(make_url(sys.argv[1])).get("scan:demo")
assert lock.acquire(blocking=False)
print("held", flush=True)
time.sleep(3600)
"""


def test_a_killed_holder_releases_the_lock(catalog_url):
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, catalog_url], stdout=subprocess.PIPE, text=True)
    locks = ClusterLocks(make_url(catalog_url))
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = locks.get("scan:demo")
        assert not lock.acquire(blocking=False)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        # The server (PostgreSQL) or the kernel (flock) releases it when the holder's connection or file closes.
        assert lock.acquire(timeout=PATIENCE_S)
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
        locks.dispose()


def test_a_background_rescan_skips_while_another_replica_scans(catalog_url, cache_copy):
    catalog = Catalog(catalog_url)
    other = ClusterLocks(make_url(catalog_url))
    try:
        storage = open_storage(str(cache_copy))
        with other.get("scan:demo"):
            with pytest.raises(LockBusyError, match="another replica"):
                rescan(catalog, "demo", storage, wait_s=0)
        assert rescan(catalog, "demo", storage, wait_s=0).added > 0
    finally:
        other.dispose()
        catalog.dispose()


def test_a_replica_that_waited_for_anothers_scan_takes_it_as_its_own(catalog_url, cache_copy, tmp_path):
    """A replica's first need of a scan (its verify pass's) while another replica scans the cache waits for that scan
    and lists nothing itself: a second first scan right after would list the root again and hold its listing beside
    the other's (at 1M entries, about 700 MiB more at the service's peak)."""
    state = State(settings(tmp_path, {"demo": str(cache_copy)}, db=catalog_url))
    register(state.catalog, {"demo": str(cache_copy)}, "keep")
    other = ClusterLocks(make_url(catalog_url))
    try:
        waiting = threading.Thread(target=ensure_scanned, args=(state, "demo"))
        with other.get("scan:demo"):  # the other replica's scan
            waiting.start()
            waiting.join(timeout=1.0)
            assert waiting.is_alive(), "ensure_scanned returned while another replica held the scan lock"
            with state.catalog.session() as s:  # what the other's scan notes as it ends
                s.execute(update(CacheRow).where(CacheRow.name == "demo").values(last_scan_s=time.time()))
        waiting.join(timeout=PATIENCE_S)
        assert not waiting.is_alive() and "demo" in state.scanned
        with state.catalog.session() as s:
            assert s.scalar(select(func.count()).select_from(EntryRow)) == 0, "it scanned the root again"
    finally:
        other.dispose()
        state.catalog.dispose()


# --------------------------------------------------------------------------------------------------------------
# Ingestion from two replicas at once


def test_two_replicas_draining_at_once_fold_each_record_once(catalog_url, cache_copy, jax_caches):
    """Many processes' records hitting and writing the same keys, accepted into the inbox and drained by two
    catalogs (two replicas, each with its own connections and no shared thread lock) at once: no record is folded
    twice or lost (hits add up), every per-key aggregate ends equal to a full recomputation, and the inbox ends
    empty."""
    keys = keys_of(jax_caches["zstd"])
    pool = [keys["jit_train_step"], keys["jit_tiny"], keys["jit_odd-name.v2"]]
    replicas = [Catalog(catalog_url), Catalog(catalog_url)]
    try:
        rescan(replicas[0], "demo", open_storage(str(cache_copy)))
        rng = random.Random(7)
        now = time.time()
        recs: list[RunRecord] = []
        for i in range(60):
            first, second = rng.sample(pool, 2)
            if i % 10 == 0:  # some writers, so first writers and saved seconds move while readers arrive
                usages = [write(first, rng.uniform(1, 9), now - rng.uniform(3600, 7200))]
            else:
                usages = [hit(first, rng.randrange(1, 5), now - rng.uniform(0, 3600), retrieval_s=0.01)]
            usages.append(hit(second, rng.randrange(1, 5), now - rng.uniform(0, 3600), retrieval_s=0.02))
            recs.append(run(f"job-{i % 3}", f"run-{i}", usages, at=now - rng.uniform(0, 100)))
        start = threading.Barrier(2)

        def ingest_all(catalog: Catalog, mine: list[RunRecord]) -> None:
            start.wait()
            for i, rec in enumerate(mine):
                queue.accept(catalog, "demo", rec, rec.to_json())
                if i % 3 == 2:  # the other replica's records too: both drain what both accepted
                    queue.drain(catalog, "demo")
            queue.drain(catalog, "demo")

        with ThreadPoolExecutor(2) as ex:
            for f in [ex.submit(ingest_all, replicas[0], recs[0::2]), ex.submit(ingest_all, replicas[1], recs[1::2])]:
                f.result()

        def snapshot() -> dict:
            with replicas[0].reader() as conn:
                stats = {r[0]: tuple(r[1:]) for r in conn.execute(select(
                    KeyStatsRow.key, KeyStatsRow.hits, KeyStatsRow.saved_s, KeyStatsRow.last_hit_s,
                    KeyStatsRow.writer_run, KeyStatsRow.writer_compile_s))}
                copies = {r[0]: tuple(r[1:]) for r in conn.execute(select(
                    EntryRow.key, EntryRow.hits, EntryRow.saved_s, EntryRow.last_hit_s, EntryRow.writer_run,
                    EntryRow.writer_compile_s).where(EntryRow.key.in_(pool), EntryRow.kind == "entry"))}
                saved = {tuple(r[:3]): r[3] for r in conn.execute(select(
                    UsageRow.run_id, UsageRow.process_index, UsageRow.key, UsageRow.saved_s))}
            return {"stats": stats, "copies": copies, "saved": saved}

        assert queue.waiting(replicas[0]) == 0
        kept = snapshot()
        expected_hits = {k: sum(u.hits for r in recs for u in r.keys if u.key == k) for k in pool}
        assert {k: v[0] for k, v in kept["stats"].items()} == expected_hits
        with replicas[0].session() as s:
            refresh(s.connection(), "demo", pool)
        fresh = snapshot()
        for part in ("stats", "copies", "saved"):
            assert kept[part].keys() == fresh[part].keys()
            for k, v in fresh[part].items():
                assert kept[part][k] == pytest.approx(v), (part, k)
        assert fresh["stats"] == {k: v for k, v in fresh["copies"].items()}
    finally:
        for c in replicas:
            c.dispose()


# --------------------------------------------------------------------------------------------------------------
# Two `jaxcache serve` processes on one catalog


class Replica:
    """One `jaxcache serve` process."""

    def __init__(self, name: str, root: Path, db: str, log: Path) -> None:
        self.name, self.log = name, log
        self.proc, self.base = start_serve(
            {"demo": root}, db, env=serve_env({ADMIN: "admin", REPORT: "report"}), args=("--rescan-s", "3600"),
            stdout=log.open("w"))
        self.port = int(self.base.rsplit(":", 1)[1])
        self.client = httpx.Client(base_url=self.base, headers=H_ADMIN, timeout=PATIENCE_S)

    def wait_ready(self) -> None:
        wait_ready(self.proc, self.base, output=self.log.read_text, patience_s=PATIENCE_S)

    def entries(self) -> list[dict]:
        out, cursor = [], None
        while True:
            params = {"limit": 2, "sort": "name", **({"cursor": cursor} if cursor else {})}
            body = self.client.get("/v1/caches/demo/entries", params=params).json()
            out += body["entries"]
            cursor = body["next_cursor"]
            if not cursor:
                return out

    def stop(self) -> None:
        self.client.close()
        stop_serve(self.proc)


@pytest.fixture
def replicas(catalog_url, cache_copy, tmp_path):
    """Two `jaxcache serve` processes, a and b, on one catalog over one cache root, both ready."""
    pair = [Replica(name, cache_copy, catalog_url, tmp_path / f"{name}.log") for name in ("a", "b")]
    try:
        for r in pair:
            r.wait_ready()
        yield pair
    finally:
        for r in pair:
            r.stop()


def _files(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_file()}


def _prune_both_while_scans_wait(replicas: list[Replica], catalog_url: str, policy: dict):
    """Send the same prune to both replicas at once while this test holds the rescan lock (as a third replica
    would). The replica that takes the prune lock first stays in its prune, waiting for that lock; the other must
    answer 409 meanwhile. Returns the winner, the loser, the future of the winner's response, and the held rescan
    lock with its ClusterLocks (release and dispose them)."""
    locks = ClusterLocks(make_url(catalog_url))
    scan = locks.get("scan:demo")
    scan.acquire()
    ex = ThreadPoolExecutor(2)
    futures = {ex.submit(r.client.post, "/v1/caches/demo/prune", json={**policy, "dry_run": False}): r
               for r in replicas}
    done = next(iter(_first_done(futures)))
    loser = futures[done]
    response = done.result()
    assert response.status_code == 409, response.text
    assert "already running" in response.json()["detail"] and "another replica" in response.json()["detail"]
    winner_future = next(f for f in futures if f is not done)
    winner = futures[winner_future]
    assert not winner_future.done()
    ex.shutdown(wait=False)
    return winner, loser, winner_future, scan, locks


def _first_done(futures):
    from concurrent.futures import FIRST_COMPLETED, wait

    done, _ = wait(list(futures), return_when=FIRST_COMPLETED)
    return done


@pytest.mark.slow
def test_replicas_serve_one_listing_and_ingest_reports_together(replicas, jax_caches):
    a, b = replicas
    assert a.entries() == b.entries()
    assert sorted(e["key"] for e in a.entries()) == sorted(e["key"] for e in jax_caches["zstd"].entries)
    keys = keys_of(jax_caches["zstd"])
    train, tiny = keys["jit_train_step"], keys["jit_tiny"]
    now = time.time()
    recs = [run("pretrain", "w", [write(train, 10.0, now - 600)], at=now - 500)]
    recs += [run(f"job-{i % 4}", f"r{i}", [hit(train, i % 3 + 1, now - i), hit(tiny, 1, now - i)], at=now - i)
             for i in range(40)]

    def post(i: int) -> int:
        r = (a if i % 2 else b).client.post("/v1/reports?cache=demo", content=recs[i].to_json(),
                                            headers={**H_REPORT, "content-type": "application/json"})
        return r.status_code

    with ThreadPoolExecutor(8) as ex:
        assert set(ex.map(post, range(len(recs)))) == {202}
    want = sum(u.hits for r in recs for u in r.keys if u.key == train)
    # Accepted, then folded by the drain of the replica that runs it (each polls the inbox every second).
    deadline = time.monotonic() + 60
    while any({e["key"]: e["hits"] for e in r.entries()}[train] != want for r in (a, b)):
        assert time.monotonic() < deadline, "the entries' copies of the aggregates never caught up"
        time.sleep(0.1)
    for r in (a, b):
        got = {e["key"]: e for e in r.entries()}
        assert got[train]["hits"] == want and got[tiny]["hits"] == 40
        assert got[train]["first_writer"]["run_id"] == "w"
        assert got[train]["saved_s"] == pytest.approx(want * 10.0)
    assert a.entries() == b.entries()


@pytest.mark.slow
def test_two_prunes_at_once_delete_each_entry_once(replicas, catalog_url, cache_copy, jax_caches):
    policy = {"functions": ["jit_tiny", "jit_odd*"], "min_age": "0s"}
    plan = replicas[0].client.post("/v1/caches/demo/prune", json=policy).json()
    planned = {d["key"] for d in plan["delete"]}
    assert planned
    before = _files(cache_copy)
    winner, loser, future, scan, locks = _prune_both_while_scans_wait(replicas, catalog_url, policy)
    try:
        assert _files(cache_copy) == before  # the winner is still waiting: nothing deleted yet
    finally:
        scan.release()
        locks.dispose()
    applied = future.result()
    assert applied.status_code == 200, applied.text
    body = applied.json()
    assert (body["deleted"], body["already_gone"], body["changed"], body["errors"]) == (len(planned), 0, 0, [])
    assert before - _files(cache_copy) == {k + "-cache" for k in planned} | {k + "-atime" for k in planned}
    for r in (winner, loser):
        audit = r.client.get("/v1/caches/demo/prunes").json()["prunes"]
        assert [(p["id"], p["deleted"]) for p in audit] == [(body["audit_id"], len(planned))]
    # The loser rescans and lists what the winner left.
    assert loser.client.post("/v1/caches/demo/rescan").status_code == 200
    assert {e["key"] for e in loser.entries()} == {e["key"] for e in jax_caches["zstd"].entries} - planned


@pytest.mark.slow
def test_killing_the_replica_that_holds_the_lock_hands_over(replicas, catalog_url, cache_copy):
    policy = {"functions": ["jit_train*"], "min_age": "0s"}
    winner, survivor, _future, scan, locks = _prune_both_while_scans_wait(replicas, catalog_url, policy)
    before = _files(cache_copy)
    try:
        kill_service(winner.proc)  # dies holding the prune lock
    finally:
        scan.release()
        locks.dispose()
    assert _files(cache_copy) == before
    deadline = time.monotonic() + PATIENCE_S  # until the server notices the dead connection; not asserted on
    while True:
        r = survivor.client.post("/v1/caches/demo/prune", json={**policy, "dry_run": False})
        if r.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200, r.text
    assert r.json()["deleted"] >= 1 and not any(n.startswith("jit_train") for n in _files(cache_copy))
    assert [p["id"] for p in survivor.client.get("/v1/caches/demo/prunes").json()["prunes"]] == [r.json()["audit_id"]]
    assert survivor.client.post("/v1/caches/demo/rescan").status_code == 200


@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)
def test_a_delete_answers_before_the_statistics_are_kept(replicas, catalog_url):
    """A single-entry DELETE is answered once the entry is gone: the cache's statistics (a pass over every entry)
    are computed and kept after it. Here another connection holds their table's write lock, and the DELETE is
    answered meanwhile; once it is let go, both replicas answer the one kept copy, without the entry."""
    a, b = replicas
    stats = "/v1/caches/demo/stats"
    before = a.client.get(stats).json()
    key = a.entries()[0]["key"]
    engine = create_engine(catalog_url)
    try:
        with engine.connect() as conn, ThreadPoolExecutor(1) as pool:
            conn.exec_driver_sql("LOCK TABLE cache_stats IN EXCLUSIVE MODE")  # reads go on; writes wait
            deleting = pool.submit(a.client.delete, f"/v1/caches/demo/entries/{key}")
            try:
                assert deleting.result(timeout=PATIENCE_S).status_code == 204
            except TimeoutError:
                raise AssertionError("the DELETE waited for the statistics to be kept") from None
            finally:
                conn.rollback()
    finally:
        engine.dispose()
    deadline = time.monotonic() + PATIENCE_S  # until the kept copy is written; not asserted on
    while True:
        after = [r.client.get(stats).json() for r in (a, b)]
        if after[0]["computed_s"] == after[1]["computed_s"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert after[0]["computed_s"] == after[1]["computed_s"] and after[0]["entries"] == before["entries"] - 1
