"""The fault suite: real faults on real parts, each test ending with the catalog and storage consistent and saying
what was lost (nothing). GCS answering 429/503 is in test_gcs_faults.py; in-process faults in test_service_faults."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from conftest import fake_entries, kill_service, serve_env, start_serve, stop_serve, tmpfs, wait_ready
from jaxcache import records
from jaxcache.errors import StorageError
from jaxcache.storage import LocalStorage

ADMIN = "fault-admin"
H = {"Authorization": f"Bearer {ADMIN}"}
PATIENCE_S = 120.0
DAY = 86400.0
KEY = "jit_f-" + "a" * 64

pytestmark = pytest.mark.slow


def _until(predicate, what: str, patience_s: float = PATIENCE_S):
    """A bound on waiting for another process, not a timing assertion."""
    deadline = time.monotonic() + patience_s
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)
    return found


def _serve(root: Path, db: str, log: Path, *args: str):
    proc, base = start_serve({"demo": root}, db, env=serve_env({ADMIN: "admin"}), args=args, stdout=log.open("a"))
    wait_ready(proc, base, output=log.read_text, patience_s=PATIENCE_S)
    return proc, base


def test_kill_9_mid_prune_then_restart_accounts_for_every_deletion(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    old = fake_entries(root, 3_000, age_days=30, tag="old")
    young = fake_entries(root, 200, age_days=0, tag="young")
    # JAX's LRU is on in this root: the prune takes JAX's cache lock around its deletions, as JAX takes it around
    # its reads and writes. The test takes it as a job would, which stops the prune at a known point, mid-way,
    # whatever the machine's speed: there the node dies (a few thousand entries are enough, not a race against the
    # deletions of twelve thousand).
    lockfile = root / ".lockfile"
    lockfile.touch()
    db, log = f"sqlite:///{tmp_path / 'catalog.sqlite'}", tmp_path / "serve.log"
    proc, base = _serve(root, db, log, "--rescan-s", "3600")
    job = os.open(lockfile, os.O_RDWR)
    fcntl.flock(job, fcntl.LOCK_EX)  # a job holds JAX's lock: the prune will wait for it at its first deletion
    with httpx.Client(base_url=base, headers=H, timeout=PATIENCE_S) as client, \
            httpx.Client(base_url=base, headers=H, timeout=PATIENCE_S) as watcher:
        import threading

        answer: dict[str, httpx.Response] = {}
        threading.Thread(target=lambda: _post_quietly(client, "/v1/caches/demo/prune",
                                                      {"unused_for": "7d", "dry_run": False}, answer),
                         daemon=True).start()

        def prune_holds_the_lock() -> bool:
            refused = answer.get("r")
            assert refused is None, f"the prune was answered before it was killed: {refused.text}"
            try:
                fcntl.flock(job, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(job, fcntl.LOCK_UN)  # not yet: let it have the lock at its next try
            time.sleep(0.001)
            return False

        # The intent is written before the first deletion, which waits for the job's lock (JAX's own timeout, 10 s,
        # is far off: the job lets go at once).
        _until(lambda: [p for p in watcher.get("/v1/caches/demo/prunes").json()["prunes"] if p["state"] == "running"],
               "the prune's intent", patience_s=300)
        fcntl.flock(job, fcntl.LOCK_UN)
        _until(prune_holds_the_lock, "the prune to take JAX's lock and delete")
        # The job waits for the lock: it has it when the prune lets go after its first entries (the prune holds it
        # across entries for 20 ms), and the prune stops at its next entry. There the node dies.
        fcntl.flock(job, fcntl.LOCK_EX)
        kill_service(proc)
    os.close(job)
    left = {p.name for p in root.iterdir()}
    with sqlite3.connect(tmp_path / "catalog.sqlite") as con:
        (state, planned), = con.execute("SELECT state, planned FROM prunes").fetchall()
        items = {name for (name,) in con.execute("SELECT name FROM prune_items")}
    assert state == "running" and planned == len(old) == len(items), "the intent was written before deleting"
    gone = {f"{k}-cache" for k in old | young} - left
    assert 0 < len(gone) < len(old), "killed mid-way"
    assert gone <= items, "every deleted entry was planned, and so audited"
    assert all(f"{k}-cache" in left and f"{k}-atime" in left for k in young), "nothing outside the policy is gone"

    proc, base = _serve(root, db, log, "--rescan-s", "3600")  # the restarted replica closes the interrupted prune
    try:
        with httpx.Client(base_url=base, headers=H, timeout=PATIENCE_S) as client:
            audit = _until(lambda: [p for p in client.get("/v1/caches/demo/prunes").json()["prunes"]
                                    if p["state"] != "running"], "the interrupted prune to be closed")
            assert audit[0]["state"] == "interrupted" and audit[0]["deleted"] == len(gone)
            assert audit[0]["errors"][0].startswith("interrupted")
            r = client.post("/v1/caches/demo/prune", json={"unused_for": "7d", "dry_run": False})
            assert r.status_code == 200 and r.json()["deleted"] == len(old) - len(gone), r.text
    finally:
        stop_serve(proc)
    assert {p.name for p in root.iterdir() if p.name.endswith("-cache")} == {f"{k}-cache" for k in young}


def test_kill_9_mid_report_storm_loses_no_accepted_record(tmp_path, cache_copy, jax_caches):
    """#58: the service killed while 80 jobs post their records. Every record answered 202 is in the catalog after
    the restart without being sent again; the jobs whose post got no answer send theirs again (as a job's next report
    does: records hold totals): each of the 80 is counted exactly once."""
    from concurrent.futures import ThreadPoolExecutor

    from reports_support import hit, keys_of, run

    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    at = time.time()
    bodies = [run(f"job-{i}", f"r{i}", [hit(train, 1, at)], at=at).to_json() for i in range(80)]
    db, log = f"sqlite:///{tmp_path / 'catalog.sqlite'}", tmp_path / "serve.log"
    proc, base = _serve(cache_copy, db, log, "--rescan-s", "3600", "--workers", "1")
    answered: dict[int, int] = {}
    sender = httpx.Client(base_url=base, headers={**H, "content-type": "application/json"}, timeout=PATIENCE_S)

    def post(i: int) -> None:
        try:
            answered[i] = sender.post("/v1/reports?cache=demo", content=bodies[i]).status_code
        except httpx.HTTPError:
            pass  # the service was killed under it: no answer, so the job's client sends it again

    pool = ThreadPoolExecutor(8)
    try:
        for i in range(len(bodies)):
            pool.submit(post, i)
        _until(lambda: len(answered) >= 20, "20 records answered")
    finally:
        kill_service(proc)  # mid-storm: some posts in flight, the rest not sent
        pool.shutdown(cancel_futures=True)
        sender.close()
    accepted = {i for i, status in answered.items() if status == 202}
    assert answered.keys() == accepted and 20 <= len(accepted) < len(bodies), answered

    proc, base = _serve(cache_copy, db, log, "--rescan-s", "3600", "--workers", "1")
    try:
        with httpx.Client(base_url=base, headers=H, timeout=PATIENCE_S) as client:
            def folded() -> dict[str, int] | None:
                if client.get("/v1/caches").json()["caches"][0]["reports_waiting"]:
                    return None
                return {j["job"]: j["hits"] for j in client.get("/v1/caches/demo/jobs").json()["jobs"]}

            # What was accepted before the kill is folded after the restart, none of it sent again (a record stored
            # just before the kill, its answer lost, may be there too).
            jobs = _until(folded, "the inbox folded after the restart")
            assert {f"job-{i}" for i in accepted} <= set(jobs) and set(jobs.values()) == {1}, (accepted, jobs)
            for i in range(len(bodies)):
                if i not in accepted:
                    r = client.post("/v1/reports?cache=demo", content=bodies[i],
                                    headers={"content-type": "application/json"})
                    assert r.status_code == 202, r.text
            jobs = _until(lambda: (found := folded()) and len(found) == len(bodies) and found, "every record folded")
            assert set(jobs.values()) == {1}  # none twice: one stored before its answer was lost is replaced
            assert client.get(f"/v1/caches/demo/entries/{train}").json()["hits"] == len(bodies)
    finally:
        stop_serve(proc)


def _post_quietly(client: httpx.Client, path: str, body: dict, answer: dict[str, httpx.Response]) -> None:
    try:
        answer["r"] = client.post(path, json=body)
    except httpx.HTTPError:
        pass  # the service was killed under it: that is the test


def test_postgres_stopped_and_restarted_mid_rescan_the_loops_recover(tmp_path, private_postgres, cache_copy):
    log = tmp_path / "serve.log"
    proc, base = _serve(cache_copy, private_postgres.create_database(), log, "--rescan-s", "0.5", "--workers", "2")
    try:
        with httpx.Client(base_url=base, headers=H, timeout=PATIENCE_S) as client:
            before = client.get("/v1/caches/demo/entries?limit=1000").json()["entries"]
            added = fake_entries(cache_copy, 3000, age_days=1, tag="new")  # a long rescan to stop it in
            time.sleep(0.3)
            private_postgres.stop()
            down = _until(lambda: (r := client.get("/readyz")).status_code == 503 and r.json(), "readyz to say so")
            assert "catalog" in down["detail"]
            failing = _until(lambda: (r := client.get("/readyz").json()["loops"].get("rescan", {})).get("failures")
                             and r, "the rescan loop to report the outage")
            assert failing["last_error"]
            private_postgres.start()
            _until(lambda: client.get("/readyz").status_code == 200, "the service to be ready again")
            _until(lambda: client.get("/readyz").json()["loops"]["rescan"]["failures"] == 0, "rescans to recover")
            _until(lambda: client.get("/v1/caches").json()["caches"][0]["entries"] == len(before) + len(added),
                   "the new entries to be cataloged")
            for e in before:
                assert client.get(f"/v1/caches/demo/entries/{e['key']}").status_code == 200, "no row lost"
            assert proc.poll() is None, "recovered without a restart"
    finally:
        stop_serve(proc)
    said = log.read_text()
    # Once per kind of error (the cache's part of a round, the round itself) in each worker, not every round (a
    # round every 0.5 s through the outage).
    assert 1 <= said.count("background rescan failed") <= 4, said
    assert "Traceback" not in said and max(map(len, said.splitlines())) < 1000, "one line on an outage"


def test_a_local_root_removed_and_restored_keeps_its_rows(tmp_path, cache_copy):
    """Twice: each time the rescan loop logs the outage once, not at each of its failed rounds. One worker: each
    worker logs what its own rounds see, and another's success ends no outage of its own."""
    log = tmp_path / "serve.log"
    proc, base = _serve(cache_copy, f"sqlite:///{tmp_path / 'c.sqlite'}", log, "--rescan-s", "0.3", "--workers", "1")
    away = cache_copy.with_name("away")
    logged = 0  # lines saying the rescan loop failed, so far
    try:
        with httpx.Client(base_url=base, headers=H, timeout=PATIENCE_S) as client:
            before = client.get("/v1/caches/demo/entries?limit=1000").json()["entries"]
            for _ in range(2):
                cache_copy.rename(away)
                gone = _until(lambda: (r := client.get("/readyz").json()["loops"].get("rescan", {})).get(
                    "failures", 0) >= 3 and r, "three failed rescan rounds with the root gone")
                assert "does not exist" in gone["last_error"]
                assert client.get("/v1/caches/demo/entries?limit=1000").json()["entries"] == before
                away.rename(cache_copy)
                _until(lambda: client.get("/readyz").status_code == 200, "the root to be back")
                _until(lambda: client.get("/readyz").json()["loops"]["rescan"]["failures"] == 0, "rescans to recover")
                assert client.get("/v1/caches/demo/entries?limit=1000").json()["entries"] == before
                said = log.read_text()
                # Once per kind of error (the root gone, nothing else here), not once per failed round.
                assert 1 <= said.count("background rescan failed") - logged < gone["failures"], said
                logged = said.count("background rescan failed")
    finally:
        stop_serve(proc)


def test_a_full_disk_while_a_record_is_written_keeps_the_old_one(tmp_path):
    with tmpfs(tmp_path / "vol", size="256k") as vol:
        storage = LocalStorage(vol)
        name = f"{records.RUNS_PREFIX}2026-12-01/r1-p0.json"
        storage.write_atomic(name, b'{"version": 1}')
        fd = os.open(vol / "filler", os.O_WRONLY | os.O_CREAT)  # the volume fills up (someone else's files)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        with pytest.raises(StorageError, match="No space left"):
            storage.write_atomic(name, b'{"version": 2, "keys": "' + b"k" * 64 * 1024 + b'"}')
        assert storage.read(name) == b'{"version": 1}'
        leftovers = [p.name for p in (vol / records.RUNS_PREFIX / "2026-12-01").iterdir()]
        assert leftovers == ["r1-p0.json"], "no partial file left behind"


def test_a_job_on_a_full_volume_still_finishes(tmp_path):
    import json
    import subprocess
    import sys

    job = Path(__file__).parent / "programs" / "client_job.py"
    with tmpfs(tmp_path / "vol", size="128k") as vol:
        cache = vol / "cache"
        cache.mkdir()
        fd = os.open(vol / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_COMPILATION_CACHE"))}
        proc = subprocess.run([sys.executable, str(job), "--cache-dir", str(cache), "--job", "full"],
                              capture_output=True, text=True, timeout=300, env={**env, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("jaxcache: could not write the run record") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["stats"]["misses"] >= 4


def _malformed_records(day_dir: Path, n: int) -> None:
    """``n`` broken run records of many kinds, as a buggy or hostile writer would leave them."""
    good = {"schema": "jaxcache.run/1", "job": "train", "run_id": "r", "process_index": 0, "process_count": 1,
            "host": "h", "started_at": time.time(), "updated_at": time.time(),
            "fingerprint": {"jax": "0.10.2", "jaxlib": "0.10.2"}, "keys": []}
    import json

    breakers = [
        lambda i: b"{not json",
        lambda i: b"",
        lambda i: json.dumps({**good, "schema": "jaxcache.run/99"}).encode(),
        lambda i: json.dumps({**good, "process_index": 2**40, "process_count": 2**41}).encode(),
        lambda i: json.dumps({**good, "host": "h" * 5000}).encode(),
        lambda i: json.dumps({**good, "job": "a\u0000b"}).encode(),
        lambda i: json.dumps({**good, "keys": [{"key": KEY, "event": "write", "sha256": 12345}]}).encode(),
        lambda i: json.dumps({**good, "started_at": 1e300}).encode(),
        lambda i: json.dumps([good]).encode(),
        lambda i: json.dumps({**good, "keys": [{"key": KEY, "event": "hit"}] * 2}).encode(),
    ]
    for i in range(n):
        (day_dir / f"bad{i:04d}-p0.json").write_bytes(breakers[i % len(breakers)](i))


def test_a_thousand_malformed_records_are_counted_never_fatal(tmp_path, cache_copy, catalog_url, caplog):
    import logging

    from fastapi.testclient import TestClient

    from jaxcache.service.app import create_app
    from test_service import H_ADMIN, make_settings

    day = cache_copy / records.RUNS_PREFIX / time.strftime("%Y-%m-%d", time.gmtime())
    day.mkdir(parents=True)
    _malformed_records(day, 1000)
    app = create_app(make_settings(tmp_path, {"demo": str(cache_copy)}, db=catalog_url))
    client = TestClient(app)  # no background rounds: the test's rescans are the only ones
    with caplog.at_level(logging.WARNING, logger="jaxcache.service"):
        first = client.post("/v1/caches/demo/rescan", headers=H_ADMIN)
        again = client.post("/v1/caches/demo/rescan", headers=H_ADMIN)
    assert first.status_code == 200 and first.json()["records_malformed"] == 1000, first.text
    assert again.status_code == 200 and again.json()["records_malformed"] == 0, "each is read once"
    assert 'jaxcache_reports_malformed_total{source="storage"} 1000.0' in client.get("/metrics").text
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "skipped 1000 malformed run records" in warnings[0], warnings[:3]
    assert not [r for r in caplog.records if r.exc_info], "no traceback"
