"""Run records into the catalog: from rescans and from POST /v1/reports, idempotent, malformed ones refused, and
the aggregates they feed (first writer, hits, seconds saved) equal to a full recompute."""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid

import msgspec
import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache import records
from jaxcache.service.app import create_app
from reports_support import (
    BOTH,
    H_ADMIN,
    H_READ,
    H_REPORT,
    NEW,
    compiled,
    counted,
    entries,
    hit,
    post,
    put_record,
    report,
    rescan,
    run,
    settings,
    write,
)

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
    # Today's folder, which every rescan lists (old days settle: test_service_retention_listing.py).
    (cache_copy / records.RUNS_PREFIX / records.day_of(now)).mkdir(parents=True, exist_ok=True)
    bad = cache_copy / records.RUNS_PREFIX / records.day_of(now) / "broken-p0.json"
    bad.write_text('{"schema": "jaxcache.run/1", "job": ')

    with caplog.at_level(logging.WARNING, logger="jaxcache.service"):
        r = rescan(svc)
    assert (r["records_ingested"], r["records_malformed"]) == (2, 1)
    warnings = [m for m in caplog.messages if "malformed run record" in m]
    assert len(warnings) == 1 and "broken-p0.json" in warnings[0]

    listed = entries(svc)
    e = listed[train]
    assert e["first_writer"] == {"job": "pretrain", "run_id": "r1", "process_index": 0, "host": "node-1",
                                 "topology": "2x4x8", "jax": NEW, "jaxlib": NEW, "at_s": pytest.approx(now - 3600),
                                 "machine": "cpu"}  # its record's device kind (and no CPU count)
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
    # Counted by whichever drain folded each (test_a_record_is_counted_once_by_the_drain_that_folds_it): where the
    # drain loop folded one first, its count follows its commit, so a moment after the rescan's answer.
    assert counted(svc, 'jaxcache_reports_ingested_total{cache="demo",source="storage"}', 3) == 3


def test_a_record_is_counted_once_by_the_drain_that_folds_it(tmp_path, cache_copy, keys):
    """``jaxcache_reports_ingested_total`` counts what a drain folded, by the record's source, whichever drain it was:
    here a POST to an `api` process (no drain loop there) and a record file, both folded by a rescan's drain."""
    now = time.time()
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, role="api"))) as api:
        posted = run("finetune", "r2", [hit(keys["jit_train_step"], 2, now - 60)], at=now - 30)
        r = api.post("/v1/reports?cache=demo", content=posted.to_json(),
                     headers={**H_REPORT, "content-type": "application/json"})
        assert r.status_code == 202, r.text
        put_record(cache_copy, run("pretrain", "r1", [write(keys["jit_tiny"], 0.4, now - 3600)], at=now - 3500))
        assert rescan(api)["records_ingested"] == 1  # the record file it read
        text = api.get("/metrics").text
        for source in ("report", "storage"):
            assert f'jaxcache_reports_ingested_total{{cache="demo",source="{source}"}} 1.0' in text, source
        assert entries(api)[keys["jit_train_step"]]["hits"] == 2


@BOTH
def test_post_report_ingests_the_same_record(svc, cache_copy, keys, tmp_path):
    now = time.time()
    train = keys["jit_train_step"]
    # The job spelled the directory through a symlink and with a trailing slash: still this cache.
    link = tmp_path / "mnt-link"
    link.symlink_to(cache_copy)
    rec = run("pretrain", "r1", [write(train, 8.0, now - 60)], at=now - 30, cache_dir=f"{link}/")
    r = post(svc, rec)
    assert r.status_code == 202, r.text
    assert r.json() == {"cache": "demo", "run_id": "r1", "process_index": 0, "runs": 1, "keys": 1, "stale": False}
    e = svc.get(f"/v1/caches/demo/entries/{train}", headers=H_READ).json()
    assert e["first_writer"]["job"] == "pretrain" and e["measured_compile_s"] == 8.0
    assert e["jobs"] == [{"job": "pretrain", "hits": 0, "compiles": 1, "writes": 1, "processes": 1,
                          "last_s": pytest.approx(now - 60), "saved_s": 0.0}]
    assert counted(svc, 'jaxcache_reports_ingested_total{cache="demo",source="report"}', 1) == 1


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer nope"}, 401), (H_READ, 403), (H_REPORT, 202), (H_ADMIN, 202)],
)
def test_post_report_auth(svc, keys, headers, status):
    rec = run("j", "r1", [write(keys["jit_tiny"], 1.0, time.time())])
    r = post(svc, rec, "?cache=demo", headers=headers)
    assert r.status_code == status, r.text
    assert (svc.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"] != []) == (status == 202)


def test_post_report_needs_a_known_cache(svc, keys, tmp_path):
    # A well-formed record for a cache this service does not have: 404, as for ?cache= naming none.
    rec = run("j", "r1", [write(keys["jit_tiny"], 1.0, time.time())])
    assert post(svc, rec, "?cache=nope").status_code == 404
    r = post(svc, rec)  # no cache_dir and no ?cache=
    assert r.status_code == 404 and "?cache=" in r.json()["detail"]
    rec.cache_dir = str(tmp_path / "elsewhere")
    r = post(svc, rec)
    assert r.status_code == 404 and "not the root of any configured cache" in r.json()["detail"]
    rec.cache_dir = "gs://some-bucket/jax"
    assert post(svc, rec).status_code == 404
    assert svc.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"] == []


def test_a_record_of_another_caches_root_is_refused_under_the_cache_named(tmp_path, cache_copy, keys):
    """?cache= files a record whose cache_dir is no configured root, or the root the named cache shares with
    another; a record whose cache_dir is another cache's root (and not the named one's) is refused: 422, naming it."""
    other = tmp_path / "other"
    other.mkdir()
    caches = {"c1": str(cache_copy), "c1b": str(cache_copy), "c2": str(other)}
    with TestClient(create_app(settings(tmp_path, caches))) as client:
        settled(client)
        now = time.time()

        def rec(job: str, cache_dir: str):
            return run(job, job, [write(keys["jit_tiny"], 1.0, now)], cache_dir=cache_dir)

        r = post(client, rec("misfiled", str(other) + "/"), "?cache=c1")
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == (f"the record's cache_dir {str(other) + '/'!r} is the root of cache c2, not of "
                                      "c1: post it with ?cache=c2 or without ?cache=; nothing stored")
        assert post(client, rec("shared", str(cache_copy)), "?cache=c1b").status_code == 202
        assert post(client, rec("own", str(cache_copy) + "/"), "?cache=c1").status_code == 202
        assert post(client, rec("elsewhere", str(tmp_path / "elsewhere")), "?cache=c1").status_code == 202
        assert post(client, rec("unsaid", None), "?cache=c1").status_code == 202

        def jobs(cache: str) -> set[str]:
            return {j["job"] for j in client.get(f"/v1/caches/{cache}/jobs", headers=H_READ).json()["jobs"]}

        assert jobs("c1") == {"own", "elsewhere", "unsaid"} and jobs("c1b") == {"shared"} and jobs("c2") == set()
        assert 'jaxcache_reports_malformed_total{source="report"} 1.0' in client.get("/metrics").text


# The spellings a job (or a hand-made record) may give another cache's root: each names c2's root as the core opens
# roots (jaxcache.storage.open_storage: a path made absolute, file:// with an empty or "localhost" host and
# %-escapes decoded) and the service compares them (real paths: links resolved, "." and ".." folded, slashes
# doubled or trailing dropped).
SPELLINGS = {
    "trailing slash": lambda c2: f"{c2}/",
    "trailing /.": lambda c2: f"{c2}/.",
    "double slash": lambda c2: f"{c2.parent}//{c2.name}",
    "leading double slash": lambda c2: f"/{c2}",
    "./ segment": lambda c2: f"{c2.parent}/./{c2.name}",
    ".. that comes back": lambda c2: f"{c2.parent}/c1/../{c2.name}",
    ".. through no folder": lambda c2: f"{c2.parent}/nothing-here/../{c2.name}",
    "file:// URL": lambda c2: f"file://{c2}",
    "file:// URL, trailing slash": lambda c2: f"file://{c2}/",
    "a link to it": lambda c2: str(c2.parent / "link-to-c2"),
    "a link to its folder": lambda c2: f"{c2.parent / 'link-to-parent'}/{c2.name}/",
    "file://localhost URL": lambda c2: f"file://localhost{c2}",
    "file:// URL with %-escapes": lambda c2: f"file://{c2.parent}/%{ord(c2.name[0]):02X}{c2.name[1:]}",
}
# Not c2's root wherever the job ran: a relative path is relative to the job's own folder (which the service does
# not know; the client records absolute paths), and Linux paths are case-sensitive.
NOT_ITS_ROOT = {
    "relative": lambda c2: c2.name,
    "./ relative": lambda c2: f"./{c2.name}",
    "upper case": lambda c2: str(c2).upper(),
}


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory):
    """A service over two caches, c1 and c2 (empty roots: a record may name keys its root does not hold yet)."""
    tmp = tmp_path_factory.mktemp("two-caches")
    for name in ("c1", "c2"):
        (tmp / name).mkdir()
    (tmp / "link-to-c2").symlink_to(tmp / "c2")
    (tmp / "link-to-parent").symlink_to(tmp)
    with TestClient(create_app(settings(tmp, {"c1": str(tmp / "c1"), "c2": str(tmp / "c2")}))) as client:
        settled(client)
        yield client, (tmp / "c2").resolve()


def _jobs(client, cache: str) -> set[str]:
    return {j["job"] for j in client.get(f"/v1/caches/{cache}/jobs", headers=H_READ).json()["jobs"]}


@pytest.mark.parametrize("spelled", list(SPELLINGS.values()), ids=list(SPELLINGS))
def test_another_caches_root_is_refused_however_it_is_spelled(two_caches, spelled):
    client, c2 = two_caches
    cache_dir = spelled(c2)
    job = f"misfiled-{uuid.uuid4().hex[:8]}"
    record = run(job, "r1", [write(f"jit_f-{'0' * 64}", 1.0, time.time())], cache_dir=cache_dir)
    r = post(client, record, "?cache=c1")
    assert r.status_code == 422, (cache_dir, r.status_code, r.text)
    assert r.json()["detail"].startswith(f"the record's cache_dir {cache_dir!r} is the root of cache c2, not of c1")
    assert job not in _jobs(client, "c1")
    assert post(client, record).json()["cache"] == "c2"  # without ?cache=, it is filed under c2


@pytest.mark.parametrize("spelled", list(NOT_ITS_ROOT.values()), ids=list(NOT_ITS_ROOT))
def test_a_cache_dir_that_is_no_configured_root_is_filed_under_the_cache_named(two_caches, spelled):
    client, c2 = two_caches
    job = f"elsewhere-{uuid.uuid4().hex[:8]}"
    record = run(job, "r1", [write(f"jit_f-{'0' * 64}", 1.0, time.time())], cache_dir=spelled(c2))
    assert post(client, record, "?cache=c1").status_code == 202
    assert job in _jobs(client, "c1")


# How a job may spell a root in an object store (``scheme://bucket/team/jax-cache``).
STORE_SPELLINGS = {
    "trailing slash": lambda root: f"{root}/",
    "trailing slashes": lambda root: f"{root}///",
    "double slash before the prefix": lambda root: root.replace("/team", "//team"),
    "double slashes inside": lambda root: root.replace("/jax-cache", "//jax-cache/"),
}


def test_every_spelling_of_an_object_store_root_reaches_its_cache(tmp_path, store_root):
    """A root in each store, spelled as a job may spell it: the client configures JAX with the one spelling the
    service and the CLI use (storage.normalise_root), and the service files the job's record under that cache,
    never under another."""
    from jaxcache.client import options
    from jaxcache.storage import open_storage

    (tmp_path / "c1").mkdir()
    c2 = store_root.replace("/jax-cache", "/team/jax-cache")
    with TestClient(create_app(settings(tmp_path, {"c1": str(tmp_path / "c1"), "c2": c2}))) as client:
        settled(client)
        for what, spelled in STORE_SPELLINGS.items():
            cache_dir = spelled(c2)
            resolved = options.resolve(cache_dir, env={}, job=None, min_compile_time_secs=None,
                                       min_entry_size_bytes=None, xla_caches=None, max_size_bytes=None,
                                       service_url=None, token=None, trust="strict", default_xla_caches=None)
            assert resolved.cache_dir == c2 == open_storage(cache_dir).url, what
            job = f"misfiled-{uuid.uuid4().hex[:8]}"
            record = run(job, "r1", [write(f"jit_f-{'0' * 64}", 1.0, time.time())], cache_dir=cache_dir)
            r = post(client, record, "?cache=c1")
            assert r.status_code == 422 and "is the root of cache c2" in r.json()["detail"], (what, r.text)
            assert post(client, record).json()["cache"] == "c2", what  # without ?cache=, filed under c2
        assert _jobs(client, "c1") == set()


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
        json.dumps(good).encode()[:-1] + b',"extra":' + b"[" * 1000 + b"]" * 1000 + b"}",  # nested too deep
        json.dumps(good).encode()[:-1] + b',"extra":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        json.dumps(good).encode().replace(b'"updated_at":', b'"updated_at":NaN,"x":', 1),
        json.dumps(good).encode().replace(b'"updated_at":', b'"updated_at":Infinity,"x":', 1),
        # The red team's other kinds (issue 49): each refused with our one line, whatever part it breaks.
        b"",
        b"null",
        b"\xef\xbb\xbf" + json.dumps(good).encode(),  # a byte-order mark
        json.dumps(good).encode().replace(b'"node-1"', b'"\xff\xfe"'),  # not UTF-8
        json.dumps(good).encode().replace(b'"node-1"', b'"\\ud800"'),  # a lone surrogate
        json.dumps(good).encode().replace(b'"updated_at":', b'"updated_at":1e400,"x":', 1),
        json.dumps({k: v for k, v in good.items() if k != "schema"}).encode(),
        json.dumps({**good, "host": "h" * 5000}).encode(),
        json.dumps({**good, "job": "a/b"}).encode(),
        json.dumps({**good, "kind": "root"}).encode(),
        json.dumps({**good, "cache_dir": "/x\u0000y"}).encode(),
        json.dumps({**good, "process_index": 2**40, "process_count": 2**41}).encode(),
        json.dumps({**good, "started_at": 1e300}).encode(),
        json.dumps({**good, "started_at": -5}).encode(),
        json.dumps({**good, "keys": "train"}).encode(),
        json.dumps({**good, "keys": [{"key": train, "event": "hit", "hits": -1}]}).encode(),
        json.dumps({**good, "keys": [{"key": train, "event": "hit", "hits": 1.5}]}).encode(),
        json.dumps({**good, "keys": [{"key": train, "event": "write", "sha256": 12345}]}).encode(),
        json.dumps({**good, "keys": [{"key": "jit_" + "f" * 5000 + "-" + "a" * 64, "event": "hit"}]}).encode(),
    ]
    for body in bodies:
        r = post(svc, body, "?cache=demo")
        assert r.status_code == 422, (body[:80], r.status_code, r.text)
        assert isinstance(r.json()["detail"], str) and r.json()["detail"]
    assert _catalog_state(svc) == before
    assert f'jaxcache_reports_malformed_total{{source="report"}} {len(bodies)}.0' in svc.get("/metrics").text


def test_report_body_limit_is_its_own(tmp_path, cache_copy, keys):
    app = create_app(settings(tmp_path, {"demo": str(cache_copy)}, max_report_bytes=2000))
    with TestClient(app) as client:
        rec = run("j", "r1", [write(keys["jit_tiny"], 1.0, time.time())])
        assert post(client, rec, "?cache=demo").status_code == 202
        big = run("j", "r2", [hit(f"jit_f{i}-{'0' * 64}", 1, time.time()) for i in range(40)])
        assert len(big.to_json()) > 2000
        assert post(client, big, "?cache=demo").status_code == 413
    # The general limit (64 KiB) does not apply to reports.
    app = create_app(settings(tmp_path / "b", {"demo": str(cache_copy)}))
    with TestClient(app) as client:
        many = run("j", "r3", [hit(f"jit_f{i}-{'0' * 64}", 1, time.time()) for i in range(2000)])
        assert len(many.to_json()) > 64 * 1024
        r = post(client, many, "?cache=demo")
        assert r.status_code == 202 and r.json()["keys"] == 2000


@BOTH
def test_reingest_is_idempotent(svc, keys):
    now = time.time()
    train, tiny = keys["jit_train_step"], keys["jit_tiny"]
    report(svc, run("pretrain", "w", [write(train, 5.0, now - 500)], at=now - 400))
    rec = run("eval", "r", [hit(train, 2, now - 100, retrieval_s=0.2), compiled(tiny, 0.3, now - 100)], at=now - 90)
    assert post(svc, rec, "?cache=demo").json()["stale"] is False
    once = _catalog_state(svc)
    again = post(svc, rec, "?cache=demo")
    assert again.status_code == 202 and again.json()["runs"] == 1
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


@BOTH
def test_a_newer_record_without_a_key_takes_its_figures_away(svc, keys):
    """A process's newer record replaces it whole: a key it no longer names loses its hits, and its first writer
    when that process was the only one; another process's write becomes the first, and readers' seconds saved are
    weighed by that writer's measure."""
    now = time.time()
    odd, tiny = keys["jit_odd-name.v2"], keys["jit_tiny"]
    report(svc, run("a", "r1", [write(odd, 10.0, now - 900), hit(tiny, 3, now - 800)], at=now - 800))
    report(svc, run("b", "r2", [write(odd, 4.0, now - 700)], at=now - 650))
    report(svc, run("c", "r3", [hit(odd, 2, now - 600)], at=now - 600))
    before = entries(svc)
    assert before[odd]["first_writer"]["job"] == "a" and before[odd]["saved_s"] == pytest.approx(2 * 10.0)
    assert before[tiny]["hits"] == 3
    report(svc, run("a", "r1", [], at=now - 500))  # the same process, its record now naming no key
    after = entries(svc)
    assert after[odd]["first_writer"]["job"] == "b" and after[odd]["saved_s"] == pytest.approx(2 * 4.0)
    assert after[tiny]["hits"] == 0 and after[tiny]["first_writer"] is None
    jobs = {j["job"]: j for j in svc.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"]}
    assert jobs["a"]["hits"] == 0 and jobs["a"]["writes"] == 0 and jobs["c"]["saved_s"] == pytest.approx(8.0)


@BOTH
def test_node_local_tier_counts_show_per_process_in_the_job(svc, keys):
    """A process's node-local tier counts (#35), as its newest record says, in the job's API answer and on its page;
    a process without a tier shows nothing of one."""
    now = time.time()
    train = keys["jit_train_step"]
    tier = records.LocalTierCounts(directory="/var/cache/jaxcache/local/ab12", loaded=3, loaded_bytes=3000,
                                   fetched=2, fetched_bytes=2048, fetched_s=1.25, skipped=1, uploaded=4,
                                   uploaded_bytes=4096, uploaded_s=0.5, upload_failed=1, upload_pending=2,
                                   dropped=5, evicted=6, prefetch_wanted=9, prefetched=7, prefetched_bytes=7168,
                                   prefetched_s=2.5, prefetch_waited=1, prefetch_unused=2)
    first = msgspec.structs.replace(run("pretrain", "r1", [hit(train, 1, now - 300)], at=now - 300),
                                    local=msgspec.structs.replace(tier, loaded=1))
    report(svc, first)
    report(svc, msgspec.structs.replace(run("pretrain", "r1", [hit(train, 3, now - 100)], at=now - 100), local=tier))
    report(svc, run("pretrain", "r1", [hit(train, 1, now - 100)], at=now - 100, process_index=1, process_count=2))
    # A late copy of the first record is stale: the newest record's counts stay.
    assert post(svc, first, "?cache=demo").json()["stale"] is True
    r = svc.get("/v1/caches/demo/jobs/pretrain", headers=H_READ)
    assert r.status_code == 200, r.text
    by_process = {p["process_index"]: p for p in r.json()["recent_runs"]}
    assert by_process[0]["local"] == msgspec.to_builtins(tier)
    assert by_process[1]["local"] is None
    page = svc.get("/caches/demo/jobs/pretrain", headers=H_READ)
    assert page.status_code == 200
    html = page.text
    assert 'data-table="local_tier"' in html and tier.directory in html
    assert 'data-process="0"' in html and 'data-process="1"' not in html
    for name in ("loaded", "prefetched", "fetched", "skipped", "uploaded", "upload_failed", "dropped", "evicted"):
        assert f'data-local="{name}" data-value="{getattr(tier, name)}"' in html
    assert "2.0 KiB in 1.2 s" in html and "4.0 KiB in 0.5 s" in html and "7 of 9, 7.0 KiB in 2.5 s (2)" in html
    # A job none of whose processes had a tier has no such table.
    report(svc, run("eval", "r2", [hit(train, 1, now - 50)], at=now - 50))
    assert 'data-table="local_tier"' not in svc.get("/caches/demo/jobs/eval", headers=H_READ).text
