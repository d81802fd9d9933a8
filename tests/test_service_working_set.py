"""GET /v1/caches/{cache}/jobs/{job}/working-set: the service answers a job's working set from its catalog, and
it is the set ``jaxcache.working_set.from_root`` reads from the same root's records (keys, order, runs, warm-ups),
on each catalog. Records are written under the root as the client and warm-up write them; run records are also
POSTed (a rescan lists only the recent days' folders once the first round is done), coverage records rescanned."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache import coverage, records
from jaxcache.service.app import create_app
from jaxcache.storage import LocalStorage
from jaxcache.working_set import Wanted, WorkingSet, from_root
from reports_support import DAY, H_READ, H_REPORT, report, rescan, settings
from working_set_support import CPU4, CPU8, OLD, key, put_run, put_warmup, use


@pytest.fixture
def root(tmp_path) -> LocalStorage:
    (tmp_path / "root").mkdir()
    return LocalStorage(str(tmp_path / "root"))


@pytest.fixture
def svc(tmp_path, root, catalog_url):
    """The service over ``root`` (records written there are ingested by ``rescan``), on each catalog."""
    with TestClient(create_app(settings(tmp_path, {"demo": root.root}, db=catalog_url))) as client:
        settled(client)
        yield client


def ask(client, job: str = "train", cache: str = "demo", **params) -> WorkingSet:
    r = client.get(f"/v1/caches/{cache}/jobs/{job}/working-set", params=params, headers=H_READ)
    assert r.status_code == 200, r.text
    return WorkingSet.from_builtins(r.json())


def test_the_service_answers_the_set_the_roots_records_give(svc, root):
    put_run(root, "r3", CPU8, [use(3, at=5), use(1, records.WRITE, at=1), use(9, records.COMPILED, at=0)],
            ago_s=60)
    put_run(root, "r3", CPU8, [use(11)], ago_s=60, process=1)  # SPMD: process 0 stands for its run
    put_run(root, "r2", CPU8, [use(2, at=2), use(1, at=3), use(5, records.WRITE, at=1)], ago_s=3600)
    put_run(root, "r1", CPU8, [use(7, at=9), use(2, records.WRITE, at=1)], ago_s=7200)
    put_run(root, "r0", CPU8, [use(8)], ago_s=3 * DAY)
    put_run(root, "new4", CPU4, [use(4)], ago_s=10)
    put_run(root, "old", OLD, [use(15)], ago_s=20)
    put_run(root, "w", CPU8, [use(12)], kind=records.WARMUP)
    put_run(root, "other", CPU8, [use(13)], job="eval")
    put_run(root, "ancient", CPU8, [use(14)], ago_s=30 * DAY)
    # Programs in key order: the catalog keeps no other order within a warm-up (docs/service.md, "Working sets").
    put_warmup(root, "wu", CPU8, {1: coverage.PRESENT, 20: coverage.WRITTEN, 21: coverage.PRESENT,
                                  22: coverage.NOT_WRITTEN}, ago_s=100)
    put_warmup(root, "wu-older", CPU8, {19: coverage.WRITTEN, 23: coverage.WRITTEN}, ago_s=200)
    put_warmup(root, "wu4", CPU4, {24: coverage.WRITTEN}, ago_s=50)
    put_warmup(root, "wu-other", CPU8, {25: coverage.WRITTEN}, job="eval")
    put_warmup(root, "wu-ancient", CPU8, {26: coverage.WRITTEN}, ago_s=20 * DAY)
    put_warmup(root, "solo", CPU8, {27: coverage.WRITTEN}, job="warm-only")
    for record in [records.parse(root.read(i.name)) for i in root.iter_objects(records.RUNS_PREFIX, recursive=True)]:
        report(svc, record)
    assert rescan(svc)["warmups_ingested"] == 6

    asked = [
        ("train", Wanted(), {}),
        ("train", Wanted(jaxlib="0.10.2"), {}),
        ("train", Wanted.of(CPU8), {}),
        ("train", Wanted.of(CPU8), {"runs": 2}),
        ("train", Wanted.of(CPU8), {"runs": 10}),
        ("train", Wanted.of(CPU8), {"runs": 10, "days": 2}),
        ("train", Wanted(device_count=8), {"runs": 1}),
        ("train", Wanted.of(OLD), {}),
        ("train", Wanted(backend="gpu"), {}),
        ("warm-only", Wanted(device_kind="cpu"), {}),
        ("eval", Wanted(), {}),
    ]
    for job, wanted, window in asked:
        got = ask(svc, job, **wanted.as_params(), **window)
        want = from_root(root, job, wanted, now=time.time(), **window)
        said = f"{job} {wanted} {window}"
        assert (got.job, got.keys, got.runs, got.warmups, got.fingerprint) == (
            want.job, want.keys, want.runs, want.warmups, want.fingerprint), said
        # Digests where both know one agree; the service also knows those of keys written outside the set.
        assert {k: got.sha256[k] for k in want.sha256} == want.sha256, said
        assert set(got.sha256) <= set(got.keys), said

    newest8 = ask(svc, **Wanted.of(CPU8).as_params())
    assert newest8.runs == ["r3", "r2", "r1"] and newest8.warmups == ["wu", "wu-older"]
    assert newest8.keys[:5] == [key(1), key(3), key(5), key(2), key(7)]  # r3's first use, then r2's, then r1's
    assert key(9) not in newest8.keys and key(22) not in newest8.keys  # compiled, never stored
    assert newest8.keys[5:] == [key(20), key(21), key(19), key(23)]
    assert newest8.sha256[key(2)] == f"{2:064x}"  # r1 wrote it: the writer's digest
    assert ask(svc, **Wanted(jaxlib="0.10.2").as_params()).runs == ["new4"]  # the newest layout; never mixed
    assert ask(svc, "warm-only").fingerprint == CPU8
    # By the root the job names, with the job's own (report) token: what the client's prefetch asks.
    by_dir = svc.get("/v1/working-set", headers=H_REPORT,
                     params={"cache_dir": root.root, "job": "train", **Wanted.of(CPU8).as_params()})
    assert by_dir.status_code == 200, by_dir.text
    assert WorkingSet.from_builtins(by_dir.json()) == newest8


def test_a_job_with_nothing_recorded_has_an_empty_set(svc):
    body = svc.get("/v1/caches/demo/jobs/never-ran/working-set", headers=H_READ).json()
    assert body == {"job": "never-ran", "keys": [], "sha256": {}, "fingerprint": None, "runs": [], "warmups": []}


@pytest.mark.parametrize("catalog_url", ["sqlite"], indirect=True)
def test_unknown_caches_bad_parameters_and_missing_tokens_are_refused(svc):
    url = "/v1/caches/demo/jobs/train/working-set"
    assert svc.get("/v1/caches/nope/jobs/train/working-set", headers=H_READ).status_code == 404
    assert svc.get("/v1/working-set", params={"cache_dir": "/no/such/root", "job": "train"},
                   headers=H_READ).status_code == 404
    assert svc.get("/v1/working-set", params={"cache_dir": "relative", "job": "train"},
                   headers=H_READ).status_code == 422
    assert svc.get(url, headers=H_REPORT).status_code == 403  # by name: a read token; by root, a job's will do
    for bad in ({"device_count": "eight"}, {"device_count": 0}, {"runs": 0}, {"days": 1000}):
        assert svc.get(url, params=bad, headers=H_READ).status_code == 422, bad
    assert svc.get(url).status_code == 401
    assert svc.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
