"""Run records in the service: ingestion from the root (rescan) and from POST /v1/reports, what entries, jobs and
stats show from them, and prunes that use them (hit-driven LRU, stale_jaxlib) on a local root and on GCS.

Records name keys of real entries written by JAX (the session's ``jax_caches``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import msgspec
import pytest
from fastapi.testclient import TestClient

from conftest import settled, upload_dir
from jaxcache import entry as fmt
from jaxcache import records
from jaxcache.records import Fingerprint, KeyUsage, RunRecord
from jaxcache.service.app import create_app
from jaxcache.service.settings import ServiceSettings

READ, ADMIN, REPORT = "read-token-123", "admin-token-456", "report-token-789"
H_READ, H_ADMIN, H_REPORT = ({"Authorization": f"Bearer {t}"} for t in (READ, ADMIN, REPORT))
DAY = 86400.0
NEW, OLD = "0.12.0", "0.10.2"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


#: Tests marked with this run on an SQLite and on a PostgreSQL catalog (the ``svc`` fixture's parameter).
BOTH = pytest.mark.parametrize("svc", ["sqlite", "postgresql"], indirect=True)


def settings(tmp_path: Path, caches: dict[str, str], db: str | None = None, **kw) -> ServiceSettings:
    return ServiceSettings(
        caches=caches, db=db or f"sqlite:///{tmp_path / 'catalog.sqlite'}", rescan_s=3600,
        tokens={sha(READ): "read", sha(ADMIN): "admin", sha(REPORT): "report"}, **kw,
    )


def age(root: Path, days: float) -> None:
    """Make every entry under root look created and last used ``days`` ago."""
    t = time.time() - days * DAY
    for p in root.iterdir():
        if p.is_file():
            if p.name.endswith("-atime"):
                p.write_bytes(fmt.encode_atime(int(t * 1e9)))
            os.utime(p, (t, t))


def run(job: str, run_id: str, keys: list[KeyUsage], *, at: float | None = None, jaxlib: str = NEW,
        topology: str | None = "1x1x1", process_index: int = 0, process_count: int = 1,
        cache_dir: str | None = None, host: str = "node-1") -> RunRecord:
    """A run record of one process, last updated at ``at`` (default now)."""
    at = time.time() if at is None else at
    return RunRecord(
        job=job, run_id=run_id, process_index=process_index, process_count=process_count, host=host,
        started_at=at - 60, updated_at=at, fingerprint=Fingerprint(jax=jaxlib, jaxlib=jaxlib, backend="cpu"),
        topology=topology, cache_dir=cache_dir, final=True, keys=keys,
    )


def write(key: str, compile_s: float, at: float) -> KeyUsage:
    return KeyUsage(key=key, event=records.WRITE, compiles=1, writes=1, compile_s=compile_s, first_at=at,
                    last_at=at)


def hit(key: str, hits: int, at: float, *, retrieval_s: float = 0.0, saved_s: float = 0.0) -> KeyUsage:
    return KeyUsage(key=key, event=records.HIT, hits=hits, retrieval_s=retrieval_s, saved_s=saved_s,
                    first_at=at - 1, last_at=at)


def compiled(key: str, compile_s: float, at: float, reason: str = "only process 0 writes the cache") -> KeyUsage:
    return KeyUsage(key=key, event=records.COMPILED, compiles=1, compile_s=compile_s, reason=reason, first_at=at,
                    last_at=at)


def keys_of(cache) -> dict[str, str]:
    """{module: key} of the test programs (compiled once each), plus "all": every key JAX wrote (some versions
    also cache helper programs, a few under one module name) and "rest": those besides train, tiny and odd."""
    found = {e["module"]: e["key"] for e in cache.entries}
    named = {m: found[m] for m in ("jit_train_step", "jit_tiny", "jit_odd-name.v2")}
    every = sorted(e["key"] for e in cache.entries)
    return {**named, "all": every, "rest": sorted(set(every) - set(named.values()))}


def put_record(root: Path, record: RunRecord) -> Path:
    path = root / record.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(record.to_json())
    return path


def entries(client, query: str = "", cache: str = "demo") -> dict[str, dict]:
    out, cursor = {}, None
    while True:
        url = f"/v1/caches/{cache}/entries?limit=2&{query}" + (f"&cursor={cursor}" if cursor else "")
        r = client.get(url, headers=H_READ)
        assert r.status_code == 200, r.text
        body = r.json()
        for e in body["entries"]:
            assert e["key"] not in out
            out[e["key"]] = e
        cursor = body["next_cursor"]
        if not cursor:
            return out


def rescan(client, cache: str = "demo") -> dict:
    r = client.post(f"/v1/caches/{cache}/rescan", headers=H_ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def report(client, record: RunRecord, query: str = "?cache=demo") -> dict:
    """POST a record that must be accepted."""
    r = post(client, record, query)
    assert r.status_code == 200, r.text
    return r.json()


def post(client, record: RunRecord | bytes, query: str = "", headers=H_REPORT):
    body = record if isinstance(record, bytes) else record.to_json()
    return client.post(f"/v1/reports{query}", content=body,
                       headers={**headers, "content-type": "application/json"})


@pytest.fixture
def svc(request, tmp_path, cache_copy):
    age(cache_copy, 10)
    db = request.getfixturevalue("pg_url") if getattr(request, "param", "sqlite") == "postgresql" else None
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, db=db))) as client:
        settled(client)
        rescan(client)
        yield client


@pytest.fixture
def keys(jax_caches) -> dict[str, str]:
    k = keys_of(jax_caches["zstd"])
    assert k["rest"]
    return k


# --------------------------------------------------------------------------------------------------------------
# Ingestion


@BOTH
def test_rescan_ingests_records_under_the_root(svc, cache_copy, keys, caplog):
    now = time.time()
    train, tiny = keys["jit_train_step"], keys["jit_tiny"]
    writer = run("pretrain", "r1", [write(train, 12.5, now - 3600), write(tiny, 0.4, now - 3600)], at=now - 3500,
                 topology="2x4x8")
    reader = run("finetune", "r2", [hit(train, 3, now - 100, retrieval_s=0.6), hit(tiny, 1, now - 50)], at=now - 50)
    put_record(cache_copy, writer)
    path = put_record(cache_copy, reader)
    (cache_copy / records.RUNS_PREFIX / "2026-01-01").mkdir(parents=True)
    bad = cache_copy / records.RUNS_PREFIX / "2026-01-01" / "broken-p0.json"
    bad.write_text('{"schema": "jaxcache.run/1", "job": ')

    with caplog.at_level(logging.WARNING, logger="jaxcache.service"):
        r = rescan(svc)
    assert (r["records_ingested"], r["records_malformed"]) == (2, 1)
    warnings = [m for m in caplog.messages if "malformed run record" in m]
    assert len(warnings) == 1 and "broken-p0.json" in warnings[0]

    listed = entries(svc)
    e = listed[train]
    assert e["first_writer"] == {"job": "pretrain", "run_id": "r1", "process_index": 0, "host": "node-1",
                                 "topology": "2x4x8", "jax": NEW, "jaxlib": NEW, "at_s": pytest.approx(now - 3600)}
    assert e["hits"] == 3 and e["last_hit_s"] == pytest.approx(now - 100)
    assert e["measured_compile_s"] == 12.5
    assert e["saved_s"] == pytest.approx(3 * 12.5 - 0.6)  # hits x (writer's compile - mean retrieval)
    assert e["last_used_s"] == pytest.approx(now - 100)  # the hit is newer than the 10-day-old -atime
    assert listed[tiny]["saved_s"] == pytest.approx(0.4)
    assert listed[keys["jit_odd-name.v2"]]["first_writer"] is None and listed[keys["jit_odd-name.v2"]]["hits"] == 0

    # Unchanged records are not read again, and the malformed one is not warned about again.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jaxcache.service"):
        again = rescan(svc)
    assert (again["records_ingested"], again["records_malformed"]) == (0, 0)
    assert not [m for m in caplog.messages if "malformed" in m]

    # A record rewritten in place (running totals) replaces its earlier version: hits are not added twice.
    reader.keys[0].hits = 5
    reader.updated_at = now - 10
    path.write_bytes(reader.to_json())
    assert rescan(svc)["records_ingested"] == 1
    assert entries(svc)[train]["hits"] == 5
    assert "jaxcache_reports_ingested_total{cache=\"demo\",source=\"storage\"} 3.0" in svc.get("/metrics").text


@BOTH
def test_post_report_ingests_the_same_record(svc, cache_copy, keys, tmp_path):
    now = time.time()
    train = keys["jit_train_step"]
    # The job spelled the directory through a symlink and with a trailing slash: still this cache.
    link = tmp_path / "mnt-link"
    link.symlink_to(cache_copy)
    rec = run("pretrain", "r1", [write(train, 8.0, now - 60)], at=now - 30, cache_dir=f"{link}/")
    r = post(svc, rec)
    assert r.status_code == 200, r.text
    assert r.json() == {"cache": "demo", "run_id": "r1", "process_index": 0, "runs": 1, "keys": 1, "stale": False}
    e = svc.get(f"/v1/caches/demo/entries/{train}", headers=H_READ).json()
    assert e["first_writer"]["job"] == "pretrain" and e["measured_compile_s"] == 8.0
    assert e["jobs"] == [{"job": "pretrain", "hits": 0, "compiles": 1, "writes": 1, "processes": 1,
                          "last_s": pytest.approx(now - 60), "saved_s": 0.0}]
    assert "jaxcache_reports_ingested_total{cache=\"demo\",source=\"report\"} 1.0" in svc.get("/metrics").text


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer nope"}, 401), (H_READ, 403), (H_REPORT, 200), (H_ADMIN, 200)],
)
def test_post_report_auth(svc, keys, headers, status):
    rec = run("j", "r1", [write(keys["jit_tiny"], 1.0, time.time())])
    r = post(svc, rec, "?cache=demo", headers=headers)
    assert r.status_code == status, r.text
    assert (svc.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"] != []) == (status == 200)


def test_post_report_needs_a_known_cache(svc, keys, tmp_path):
    rec = run("j", "r1", [write(keys["jit_tiny"], 1.0, time.time())])
    assert post(svc, rec, "?cache=nope").status_code == 404
    r = post(svc, rec)  # no cache_dir and no ?cache=
    assert r.status_code == 422 and "?cache=" in r.json()["detail"]
    rec.cache_dir = str(tmp_path / "elsewhere")
    r = post(svc, rec)
    assert r.status_code == 422 and "not the root of any configured cache" in r.json()["detail"]
    rec.cache_dir = "gs://some-bucket/jax"
    assert post(svc, rec).status_code == 422
    assert svc.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"] == []


def _catalog_state(client) -> tuple:
    jobs = client.get("/v1/caches/demo/jobs", headers=H_READ).json()
    stats = client.get("/v1/caches/demo/stats", headers=H_READ).json()
    windows = {k: {f: x for f, x in v.items() if f != "since_s"} for k, v in stats.items() if k.startswith("last_")}
    return entries(client), jobs, windows


@BOTH
def test_malformed_reports_are_422_and_store_nothing(svc, keys):
    train = keys["jit_train_step"]
    good = json.loads(run("j", "r1", [write(train, 1.0, time.time())]).to_json())
    before = _catalog_state(svc)
    bodies = [
        b"not json",
        b"[]",
        json.dumps({**good, "schema": "jaxcache.run/0"}).encode(),
        json.dumps({**good, "keys": [{"key": "not-a-key", "event": "hit"}]}).encode(),
        json.dumps({**good, "keys": [{"key": train, "event": "exploded"}]}).encode(),
        json.dumps({**good, "process_index": 3, "process_count": 2}).encode(),
        json.dumps({**good, "run_id": "../../etc"}).encode(),
        json.dumps({**good, "keys": [good["keys"][0], good["keys"][0]]}).encode(),  # one key twice
        json.dumps({**good, "updated_at": "yesterday"}).encode(),
        json.dumps({**good, "host": "node\u0000one"}).encode(),  # PostgreSQL stores no NUL in text
    ]
    for body in bodies:
        r = post(svc, body, "?cache=demo")
        assert r.status_code == 422, (body[:80], r.status_code, r.text)
        assert isinstance(r.json()["detail"], str) and r.json()["detail"]
    assert _catalog_state(svc) == before
    assert 'jaxcache_reports_malformed_total{source="report"} 10.0' in svc.get("/metrics").text


def test_report_body_limit_is_its_own(tmp_path, cache_copy, keys):
    app = create_app(settings(tmp_path, {"demo": str(cache_copy)}, max_report_bytes=2000))
    with TestClient(app) as client:
        rec = run("j", "r1", [write(keys["jit_tiny"], 1.0, time.time())])
        assert post(client, rec, "?cache=demo").status_code == 200
        big = run("j", "r2", [hit(f"jit_f{i}-{'0' * 64}", 1, time.time()) for i in range(40)])
        assert len(big.to_json()) > 2000
        assert post(client, big, "?cache=demo").status_code == 413
    # The general limit (64 KiB) does not apply to reports.
    app = create_app(settings(tmp_path / "b", {"demo": str(cache_copy)}))
    with TestClient(app) as client:
        many = run("j", "r3", [hit(f"jit_f{i}-{'0' * 64}", 1, time.time()) for i in range(2000)])
        assert len(many.to_json()) > 64 * 1024
        r = post(client, many, "?cache=demo")
        assert r.status_code == 200 and r.json()["keys"] == 2000


@BOTH
def test_reingest_is_idempotent(svc, keys):
    now = time.time()
    train, tiny = keys["jit_train_step"], keys["jit_tiny"]
    report(svc, run("pretrain", "w", [write(train, 5.0, now - 500)], at=now - 400))
    rec = run("eval", "r", [hit(train, 2, now - 100, retrieval_s=0.2), compiled(tiny, 0.3, now - 100)], at=now - 90)
    assert post(svc, rec, "?cache=demo").json()["stale"] is False
    once = _catalog_state(svc)
    again = post(svc, rec, "?cache=demo")
    assert again.status_code == 200 and again.json()["runs"] == 1
    assert _catalog_state(svc) == once
    # An older version of the record (a late periodic report) changes nothing.
    older = run("eval", "r", [hit(train, 1, now - 300)], at=now - 200)
    r = post(svc, older, "?cache=demo").json()
    assert r["stale"] is True and r["runs"] == 0
    assert _catalog_state(svc) == once
    assert once[0][train]["hits"] == 2 and once[0][train]["saved_s"] == pytest.approx(2 * 5.0 - 0.2)


@BOTH
def test_a_report_may_arrive_before_its_entry(svc, cache_copy, keys):
    now = time.time()
    late = "jit_late-" + "ab" * 32
    report(svc, run("pretrain", "r1", [write(late, 3.0, now - 60)], topology="4x8x1"))
    assert svc.get(f"/v1/caches/demo/entries/{late}", headers=H_READ).status_code == 404
    shutil.copyfile(cache_copy / (keys["jit_tiny"] + "-cache"), cache_copy / (late + "-cache"))
    assert rescan(svc)["added"] == 1
    e = svc.get(f"/v1/caches/demo/entries/{late}", headers=H_READ).json()
    assert e["first_writer"]["job"] == "pretrain" and e["first_writer"]["topology"] == "4x8x1"
    assert e["measured_compile_s"] == 3.0


def test_saved_seconds_without_a_known_writer_use_jax_figure(svc, keys):
    now = time.time()
    odd, tiny = keys["jit_odd-name.v2"], keys["jit_tiny"]
    report(svc, run("a", "r1", [hit(odd, 4, now, saved_s=7.5), hit(tiny, 1, now, saved_s=-0.2)]))
    listed = entries(svc)
    assert listed[odd]["saved_s"] == 7.5 and listed[odd]["first_writer"] is None
    assert listed[tiny]["saved_s"] == 0.0  # clipped at 0
    # The writer's record arrives later: the readers' saved seconds are recomputed from its measurement.
    report(svc, run("w", "r0", [write(odd, 10.0, now - 900)], at=now - 800))
    assert entries(svc)[odd]["saved_s"] == pytest.approx(40.0)


# --------------------------------------------------------------------------------------------------------------
# Entries, jobs, stats


@pytest.fixture
def reported(svc, keys):
    """pretrain (jaxlib NEW, 2x4x8) wrote train and tiny; finetune (OLD, 1x1x1) wrote odd and hit train twice;
    eval compiled tiny without writing it and hit train once."""
    now = time.time()
    train, tiny, odd = keys["jit_train_step"], keys["jit_tiny"], keys["jit_odd-name.v2"]
    report(svc, run("pretrain", "p1", [write(train, 20.0, now - 7200), write(tiny, 1.0, now - 7200)],
                  at=now - 7000, topology="2x4x8"))
    report(svc, run("finetune", "f1", [write(odd, 2.0, now - 5000), hit(train, 2, now - 4000, retrieval_s=1.0)],
                  at=now - 3 * DAY, jaxlib=OLD, topology="1x1x1"))
    report(svc, run("eval", "e1", [hit(train, 1, now - 100), compiled(tiny, 0.5, now - 100)], at=now - 10 * DAY,
                  process_index=1, process_count=2))
    return now


@BOTH
def test_entry_filters_and_hits_sort(svc, keys, reported):
    train, tiny, odd = keys["jit_train_step"], keys["jit_tiny"], keys["jit_odd-name.v2"]
    assert set(entries(svc, "job=pretrain")) == {train, tiny}
    assert set(entries(svc, "job=finetune")) == {train, odd}
    assert set(entries(svc, "job=eval")) == {train}  # compiled tiny without writing: not used from the cache
    assert set(entries(svc, "job=nobody")) == set()
    assert set(entries(svc, f"jaxlib={NEW}")) == {train, tiny}
    assert set(entries(svc, f"jaxlib={OLD}")) == {odd}
    assert set(entries(svc, "topology=2x4x8")) == {train, tiny}
    assert set(entries(svc, "topology=1x1x1&job=finetune")) == {odd}
    for order in ("asc", "desc"):
        got = list(entries(svc, f"sort=hits&order={order}").values())
        assert len(got) == len(keys["all"])
        values = [(e["hits"], e["key"]) for e in got]
        assert values == sorted(values, reverse=order == "desc")
    assert entries(svc)[train]["hits"] == 3


@BOTH
def test_entry_detail_lists_jobs(svc, keys, reported):
    e = svc.get(f"/v1/caches/demo/entries/{keys['jit_train_step']}", headers=H_READ).json()
    assert [(j["job"], j["hits"], j["writes"]) for j in e["jobs"]] == [
        ("eval", 1, 0), ("finetune", 2, 0), ("pretrain", 0, 1)]
    assert e["saved_s"] == pytest.approx(3 * 20.0 - 1.0)


@BOTH
def test_jobs(svc, keys, reported):
    jobs = {j["job"]: j for j in svc.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"]}
    assert list(jobs) == ["pretrain", "finetune", "eval"]  # newest run first
    p, f, e = jobs["pretrain"], jobs["finetune"], jobs["eval"]
    assert (p["runs"], p["processes"], p["hits"], p["misses"], p["writes"]) == (1, 1, 0, 2, 2)
    assert p["hit_rate"] == 0.0 and p["compile_s"] == 21.0 and p["saved_s"] == 0.0
    assert p["jaxlib"] == [NEW] and p["topologies"] == ["2x4x8"]
    assert (f["hits"], f["misses"], f["writes"]) == (2, 1, 1) and f["hit_rate"] == pytest.approx(2 / 3)
    assert f["saved_s"] == pytest.approx(2 * 20.0 - 1.0) and f["jaxlib"] == [OLD]
    assert e["hit_rate"] == 0.5 and e["last_run_s"] == pytest.approx(reported - 10 * DAY)

    d = svc.get("/v1/caches/demo/jobs/eval", headers=H_READ).json()
    assert d["hits"] == 1 and d["misses"] == 1
    assert d["missed"] == [{"key": keys["jit_tiny"], "function": "jit_tiny", "compiles": 1, "compile_s": 0.5,
                            "written": False, "reason": "only process 0 writes the cache", "in_cache": True}]
    (r,) = d["recent_runs"]
    assert (r["run_id"], r["process_index"], r["process_count"], r["hits"], r["misses"]) == ("e1", 1, 2, 1, 1)
    assert r["fingerprint_digest"] == Fingerprint(jax=NEW, jaxlib=NEW, backend="cpu").digest
    assert svc.get("/v1/caches/demo/jobs/nobody", headers=H_READ).status_code == 404
    assert svc.get("/v1/caches/demo/jobs/pretrain", headers={}).status_code == 401
    assert svc.get("/v1/caches/nope/jobs", headers=H_READ).status_code == 404


@BOTH
def test_stats_windows(svc, reported):
    stats = svc.get("/v1/caches/demo/stats", headers=H_READ).json()
    day, week = stats["last_24h"], stats["last_7d"]
    # pretrain updated 2 h ago; finetune 3 days ago; eval 10 days ago (outside both windows).
    assert (day["jobs"], day["processes"], day["hits"], day["misses"], day["saved_s"]) == (1, 1, 0, 2, 0.0)
    assert day["hit_rate"] == 0.0
    assert (week["jobs"], week["hits"], week["misses"]) == (2, 2, 3)
    assert week["hit_rate"] == pytest.approx(2 / 5) and week["saved_s"] == pytest.approx(39.0)


def test_stats_windows_without_runs(svc):
    stats = svc.get("/v1/caches/demo/stats", headers=H_READ).json()
    assert stats["last_24h"]["hit_rate"] is None and stats["last_7d"]["processes"] == 0


# --------------------------------------------------------------------------------------------------------------
# Prunes fed by reports: local root


def _files(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_file()}


def _prune(client, policy: dict, *, apply: bool = False, cache: str = "demo") -> dict:
    r = client.post(f"/v1/caches/{cache}/prune", json={**policy, "dry_run": not apply},
                    headers=H_ADMIN if apply else H_READ)
    assert r.status_code == 200, r.text
    return r.json()


@BOTH
def test_stale_jaxlib_local(svc, cache_copy, keys):
    now = time.time()
    train, tiny, odd = keys["jit_train_step"], keys["jit_tiny"], keys["jit_odd-name.v2"]
    other = keys["rest"][0]
    # Before any run record: the rule selects nothing and says why.
    plan = _prune(svc, {"stale_jaxlib": True})
    assert plan["delete"] == [] and "no run records from the last 14d" in plan["notes"][0]
    # train and tiny were written by jaxlib OLD, last run 20 days ago; other by NEW, run today; the rest: writer
    # unknown.
    report(svc, run("old", "o1", [write(train, 5.0, now - 21 * DAY), write(tiny, 1.0, now - 21 * DAY)],
                  at=now - 20 * DAY, jaxlib=OLD))
    plan = _prune(svc, {"stale_jaxlib": True})
    assert plan["delete"] == [] and plan["notes"]  # still no run within the window
    report(svc, run("new", "n1", [write(other, 5.0, now - 3600), hit(odd, 1, now - 60)], jaxlib=NEW))
    before = _files(cache_copy)
    plan = _prune(svc, {"stale_jaxlib": True})
    assert {d["key"] for d in plan["delete"]} == {train, tiny} and plan["notes"] == []
    assert plan["delete"][0]["reasons"] == [f"written by jaxlib {OLD}, which no run used in the last 14d"]
    assert _files(cache_copy) == before
    # A window long enough to include the old run: nothing is stale.
    assert _prune(svc, {"stale_jaxlib": True, "stale_jaxlib_window": "30d"})["delete"] == []
    applied = _prune(svc, {"stale_jaxlib": True}, apply=True)
    assert applied["deleted"] == 2
    assert before - _files(cache_copy) == {f"{k}{s}" for k in (train, tiny) for s in ("-cache", "-atime")}
    assert set(entries(svc)) == set(keys["all"]) - {train, tiny}


@pytest.mark.parametrize("body", [{"stale_jaxlib_window": "3d"}, {"stale_jaxlib": "perhaps"},
                                  {"stale_jaxlib": True, "stale_jaxlib_window": "soon"},
                                  {"stale_jaxlib": True, "stale_jaxlib_windows": "3d"}])
def test_bad_stale_jaxlib_policies_are_rejected(svc, cache_copy, body):
    before = _files(cache_copy)
    r = svc.post("/v1/caches/demo/prune", json={**body, "dry_run": False}, headers=H_ADMIN)
    assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
    assert _files(cache_copy) == before


@BOTH
def test_hits_drive_lru_local(svc, cache_copy, keys, jax_caches):
    now = time.time()
    train, tiny, odd = keys["jit_train_step"], keys["jit_tiny"], keys["jit_odd-name.v2"]
    unhit = sorted([train, *keys["rest"]])
    size = {e["key"]: e["size_bytes"] for e in jax_caches["zstd"].entries}
    # Every entry was created and last touched (-atime) 10 days ago; tiny was hit 1 day ago, odd 3 days ago.
    report(svc, run("a", "r1", [hit(tiny, 2, now - DAY), hit(odd, 1, now - 3 * DAY)], at=now - DAY))
    plan = _prune(svc, {"unused_for": "5d"})
    assert {d["key"] for d in plan["delete"]} == set(unhit)
    # LRU: the entries without hits go first (ties by key), then odd (hit 3 days ago) before tiny.
    plan = _prune(svc, {"max_total_bytes": size[tiny]})
    assert [d["key"] for d in plan["delete"]] == [*unhit, odd]
    assert plan["bytes_remaining"] == size[tiny]
    before = _files(cache_copy)
    applied = _prune(svc, {"max_total_bytes": size[tiny] + size[odd]}, apply=True)
    assert applied["deleted"] == len(unhit)
    assert before - _files(cache_copy) == {f"{k}{s}" for k in unhit for s in ("-cache", "-atime")}


# --------------------------------------------------------------------------------------------------------------
# Prunes fed by reports: GCS (no -atime files: hits are the only record of use)


@pytest.fixture
def gcs_svc(tmp_path, gcs_client, gcs_bucket, jax_caches):
    src = tmp_path / "src"
    shutil.copytree(jax_caches["zlib"].root, src)
    for p in src.iterdir():
        if p.name.endswith("-atime") or p.name == ".lockfile":
            p.unlink()  # JAX's LRU does not work on gs://: a real GCS cache has no -atime files
    upload_dir(gcs_client, gcs_bucket, "jc", src)
    url = f"gs://{gcs_bucket}/jc"
    with TestClient(create_app(settings(tmp_path, {"prod": url}))) as client:
        rescan(client, "prod")
        yield client, url


def _blobs(gcs_client, bucket: str) -> set[str]:
    return {b.name for b in gcs_client.list_blobs(bucket, prefix="jc/") if "/.jaxcache/" not in b.name}


def test_stale_jaxlib_gcs(gcs_svc, gcs_client, gcs_bucket, jax_caches):
    client, url = gcs_svc
    k = keys_of(jax_caches["zlib"])
    train, tiny, other = k["jit_train_step"], k["jit_tiny"], k["rest"][0]
    now = time.time()
    # The old writer's record sits in the bucket (found by a rescan); the new run reports over HTTP, naming the
    # root with a trailing slash.
    old = run("old", "o1", [write(train, 5.0, now - 21 * DAY), write(tiny, 1.0, now - 21 * DAY)],
              at=now - 20 * DAY, jaxlib=OLD)
    gcs_client.bucket(gcs_bucket).blob(f"jc/{old.name}").upload_from_string(old.to_json())
    assert rescan(client, "prod")["records_ingested"] == 1
    r = post(client, run("new", "n1", [write(other, 5.0, now - 60)], jaxlib=NEW, cache_dir=url + "/"))
    assert r.status_code == 200 and r.json()["cache"] == "prod"
    policy = {"stale_jaxlib": True, "min_age": 0}
    before = _blobs(gcs_client, gcs_bucket)
    plan = _prune(client, policy, cache="prod")
    assert {d["key"] for d in plan["delete"]} == {train, tiny}
    assert _blobs(gcs_client, gcs_bucket) == before
    assert _prune(client, policy, apply=True, cache="prod")["deleted"] == 2
    assert before - _blobs(gcs_client, gcs_bucket) == {f"jc/{train}-cache", f"jc/{tiny}-cache"}
    assert set(entries(client, cache="prod")) == set(k["all"]) - {train, tiny}


def test_hits_drive_lru_gcs(gcs_svc, gcs_client, gcs_bucket, jax_caches):
    client, _ = gcs_svc
    k = keys_of(jax_caches["zlib"])
    tiny, odd = k["jit_tiny"], k["jit_odd-name.v2"]
    unhit = sorted(set(k["all"]) - {tiny, odd})
    listed = entries(client, cache="prod")
    assert not any(e["has_atime"] for e in listed.values())
    created = max(e["created_s"] for e in listed.values())
    size = {key: e["size_bytes"] for key, e in listed.items()}
    # The emulator stamps objects with their upload time and cannot backdate them, so the hits are dated after
    # it (one and two hours later): only a hit, never creation, can make one entry more recent than another.
    report(client, run("a", "r1", [hit(odd, 1, created + 3600), hit(tiny, 3, created + 7200)], at=created + 7200),
         "?cache=prod")
    plan = _prune(client, {"max_total_bytes": size[tiny], "min_age": 0}, cache="prod")
    # Without hits, creation alone would order them; with hits, unhit ones go first, then odd, and tiny stays.
    assert [d["key"] for d in plan["delete"]][-1] == odd
    assert {d["key"] for d in plan["delete"]} == {*unhit, odd}
    # unused_for: wait until every entry is over a second old; the hit ones were used later than that.
    while time.time() < created + 1.05:
        time.sleep(0.05)
    plan = _prune(client, {"unused_for": "1s", "min_age": 0}, cache="prod")
    assert {d["key"] for d in plan["delete"]} == set(unhit)
    before = _blobs(gcs_client, gcs_bucket)
    applied = _prune(client, {"unused_for": "1s", "min_age": 0}, apply=True, cache="prod")
    assert applied["deleted"] == len(unhit)
    assert before - _blobs(gcs_client, gcs_bucket) == {f"jc/{key}-cache" for key in unhit}


def test_an_older_entries_table_is_rebuilt(tmp_path):
    import sqlite3

    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import EntryRow

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE caches (name VARCHAR(64) PRIMARY KEY, url VARCHAR(1024), last_scan_s FLOAT, "
               "last_scan_seconds FLOAT, last_scan_error VARCHAR(2048))")
    db.execute("INSERT INTO caches VALUES ('demo', '/x', 123.0, 1.0, NULL)")
    db.execute("CREATE TABLE entries (cache VARCHAR(64), key VARCHAR(512), kind VARCHAR(8), size_bytes BIGINT, "
               "PRIMARY KEY (cache, key, kind))")
    db.execute("INSERT INTO entries VALUES ('demo', 'jit_f-" + "0" * 64 + "', 'entry', 1)")
    db.commit()
    db.close()
    catalog = Catalog(f"sqlite:///{path}")
    with catalog.reader() as conn:
        cols = {r[1] for r in conn.exec_driver_sql("PRAGMA table_info(entries)")}
        assert cols == set(EntryRow.__table__.columns.keys())
        assert conn.exec_driver_sql("SELECT count(*) FROM entries").scalar() == 0
        # Not ready until the first rescan fills the index again.
        assert conn.exec_driver_sql("SELECT last_scan_s FROM caches").scalar() is None
    catalog.dispose()


@pytest.mark.parametrize(("seed", "backend"), [(seed, "sqlite") for seed in range(6)] + [(0, "postgresql"),
                                                                                         (1, "postgresql")])
def test_incremental_aggregates_equal_a_full_recompute(request, tmp_path, cache_copy, keys, seed, backend):
    """Random reports (processes rewriting growing totals, late writers, older versions, keys without entries):
    the aggregates kept as differences equal a recomputation from every row."""
    import random

    from sqlalchemy import select

    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import EntryRow, KeyStatsRow, UsageRow
    from jaxcache.service.ingestion.aggregates import recompute
    from jaxcache.service.ingestion.reports import ingest
    from jaxcache.service.tasks.rescan import rescan as do_rescan
    from jaxcache.storage import open_storage

    rng = random.Random(seed)
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'c.sqlite'}"
    catalog = Catalog(url)
    do_rescan(catalog, "demo", open_storage(str(cache_copy)))
    pool = keys["all"][:5] + [f"jit_ghost{i}-{'c' * 64}" for i in range(3)]
    now = time.time()
    state: dict[tuple[str, int], RunRecord] = {}
    for step in range(40):
        run_id, index = rng.choice(["a", "b", "c"]), rng.randrange(2)
        rec = state.get((run_id, index))
        if rec is None or rng.random() < 0.1:
            start = now - rng.uniform(0, 5 * DAY)
            rec = run(f"job-{run_id}", run_id, [], at=start, process_index=index, process_count=2,
                      jaxlib=rng.choice([NEW, OLD]))
        else:
            rec = msgspec.structs.replace(rec, keys=[msgspec.structs.replace(u) for u in rec.keys])
        for _ in range(rng.randrange(1, 4)):
            key = rng.choice(pool)
            u = next((u for u in rec.keys if u.key == key), None)
            at = rec.started_at + rng.uniform(0, 3600)
            if u is None:
                kind = rng.choice(["hit", "write", "compiled"])
                u = {"hit": hit(key, 1, at, retrieval_s=rng.uniform(0, 1), saved_s=rng.uniform(-1, 3)),
                     "write": write(key, rng.choice([None, rng.uniform(0, 20)]), at),
                     "compiled": compiled(key, rng.uniform(0, 5), at)}[kind]
                rec.keys.append(u)
            elif u.hits:
                u.hits += rng.randrange(1, 3)
                u.retrieval_s += rng.uniform(0, 1)
                u.last_at = max(u.last_at, at)
        rec.updated_at = rec.started_at + 10 * step
        if rng.random() < 0.15 and (run_id, index) in state:
            older = state[(run_id, index)]
            older = msgspec.structs.replace(older, updated_at=older.updated_at - 1, keys=older.keys[:1])
            assert ingest(catalog, "demo", older).stale
        ingest(catalog, "demo", rec)
        state[(run_id, index)] = rec

    def snapshot():
        with catalog.reader() as conn:
            stats = {r[0]: tuple(r[1:]) for r in conn.execute(select(
                KeyStatsRow.key, KeyStatsRow.hits, KeyStatsRow.last_hit_s, KeyStatsRow.saved_s, KeyStatsRow.writer_run,
                KeyStatsRow.writer_process, KeyStatsRow.writer_jaxlib, KeyStatsRow.writer_compile_s))}
            rows = {tuple(r[:3]): r[3] for r in conn.execute(select(
                UsageRow.run_id, UsageRow.process_index, UsageRow.key, UsageRow.saved_s))}
            entries = {r[0]: tuple(r[1:]) for r in conn.execute(select(
                EntryRow.key, EntryRow.hits, EntryRow.saved_s, EntryRow.last_used_s, EntryRow.writer_run))}
        return stats, rows, entries

    kept = snapshot()
    with catalog.session() as s:
        recompute(s, "demo", pool)
    fresh = snapshot()
    assert kept[0].keys() == fresh[0].keys() and kept[1].keys() == fresh[1].keys()
    for a, b in zip(kept, fresh, strict=True):
        for k in b:
            assert a[k] == pytest.approx(b[k]), (k, a[k], b[k])
    catalog.dispose()
