"""What reports add to the API (entries' hits and writers, jobs, usage windows) and to prunes (stale jaxlib,
hit-driven LRU), on local roots and on GCS."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache.records import Fingerprint
from jaxcache.service.app import create_app
from jaxcache.service.reports.records import runfiles
from reports_support import (
    BOTH,
    DAY,
    H_ADMIN,
    H_READ,
    NEW,
    OLD,
    compiled,
    entries,
    hit,
    keys_of,
    post,
    report,
    rescan,
    run,
    settings,
    write,
)
from store_servers import put_dir, raw_names, raw_put

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
    (miss,) = d["missed"]
    why = {name: miss.pop(name) for name in ("cause", "differs", "nearest", "fix")}
    assert miss == {"key": keys["jit_tiny"], "function": "jit_tiny", "misses": 1, "compiles": 1, "compile_s": 0.5,
                    "written": False, "reason": "only process 0 writes the cache", "in_cache": True}
    # pretrain wrote it two hours before and it is in the cache: eval could not load what was there.
    assert why["cause"] == "unreadable" and "remove it: " in why["fix"], why
    assert f"{keys['jit_tiny']}-" in why["fix"], "the advice names the entry it removes"
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


@BOTH
def test_warmups_and_their_verify_runs_are_not_jobs(svc, keys):
    """A warm-up writes, its verify run hits what it wrote, a job hits one of them: only the job is use."""
    now = time.time()
    train, tiny = keys["jit_train_step"], keys["jit_tiny"]
    report(svc, run("pretrain", "w1", [write(train, 20.0, now - 900), write(tiny, 1.0, now - 900)], at=now - 800,
                    kind="warmup"))
    report(svc, run("pretrain", "w1-verify", [hit(train, 1, now - 700), hit(tiny, 1, now - 700)], at=now - 650,
                    kind="warmup-verify"))
    report(svc, run("pretrain", "j1", [hit(train, 2, now - 100, retrieval_s=1.0)], at=now - 50))

    jobs = svc.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"]
    assert [(j["job"], j["runs"], j["hits"], j["misses"], j["writes"]) for j in jobs] == [("pretrain", 1, 2, 0, 0)]
    d = svc.get("/v1/caches/demo/jobs/pretrain", headers=H_READ).json()
    assert d["missed"] == [] and [r["run_id"] for r in d["recent_runs"]] == ["j1"]
    day = svc.get("/v1/caches/demo/stats", headers=H_READ).json()["last_24h"]
    assert (day["jobs"], day["runs"], day["processes"], day["hits"], day["misses"]) == (1, 1, 1, 2, 0)
    assert day["hit_rate"] == 1.0 and day["saved_s"] == pytest.approx(2 * 20.0 - 1.0)

    listed = entries(svc)
    # The warm-up is the first writer (that is who stored it); only the job's hits count as use.
    assert listed[train]["first_writer"]["run_id"] == "w1" and listed[train]["measured_compile_s"] == 20.0
    assert listed[train]["hits"] == 2 and listed[train]["last_hit_s"] == pytest.approx(now - 100)
    assert listed[tiny]["hits"] == 0 and listed[tiny]["last_hit_s"] is None and listed[tiny]["saved_s"] == 0.0
    assert set(entries(svc, "job=pretrain")) == {train}
    e = svc.get(f"/v1/caches/demo/entries/{tiny}", headers=H_READ).json()
    assert e["jobs"] == [] and e["first_writer"]["job"] == "pretrain"
    saved = svc.get("/v1/caches/demo/stats", headers=H_READ).json()["by_function_saved"]
    assert [f["function"] for f in saved] == ["jit_train_step"]


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
def store_svc(tmp_path, store_root, jax_caches):
    """The service over a root in each object store, holding a real cache as JAX leaves one there."""
    src = tmp_path / "src"
    shutil.copytree(jax_caches["zlib"].root, src)
    for p in src.iterdir():
        if p.name.endswith("-atime") or p.name == ".lockfile":
            p.unlink()  # JAX's LRU does not work on a bucket: a real cache there has no -atime files
    put_dir(store_root, src)
    with TestClient(create_app(settings(tmp_path, {"prod": store_root}))) as client:
        settled(client)  # the background's first round done: none of its rescans races the test's
        rescan(client, "prod")
        yield client, store_root


def _blobs(url: str) -> set[str]:
    return {name for name in raw_names(url) if not name.startswith(".jaxcache/")}


def test_stale_jaxlib_in_an_object_store(store_svc, jax_caches):
    client, url = store_svc
    k = keys_of(jax_caches["zlib"])
    train, tiny, other = k["jit_train_step"], k["jit_tiny"], k["rest"][0]
    now = time.time()
    # The old writer's record sits in the bucket (found by a rescan); the new run reports over HTTP, naming the
    # root with a trailing slash.
    old = run("old", "o1", [write(train, 5.0, now - 21 * DAY), write(tiny, 1.0, now - 21 * DAY)],
              at=now - 20 * DAY, jaxlib=OLD)
    raw_put(url, old.name, old.to_json())
    # Its day folder is 20 days old: found by a process's first listing (as if the record predated the service)
    # or its daily full one, not by every rescan (see test_service_retention_listing.py).
    runfiles.listings(client.app.state.jaxcache.catalog).pop("prod")
    assert rescan(client, "prod")["records_ingested"] == 1
    r = post(client, run("new", "n1", [write(other, 5.0, now - 60)], jaxlib=NEW, cache_dir=url + "/"))
    assert r.status_code == 202 and r.json()["cache"] == "prod"
    policy = {"stale_jaxlib": True, "min_age": 0}
    before = _blobs(url)
    plan = _prune(client, policy, cache="prod")
    assert {d["key"] for d in plan["delete"]} == {train, tiny}
    assert _blobs(url) == before
    assert _prune(client, policy, apply=True, cache="prod")["deleted"] == 2
    assert before - _blobs(url) == {f"{train}-cache", f"{tiny}-cache"}
    assert set(entries(client, cache="prod")) == set(k["all"]) - {train, tiny}


def test_hits_drive_lru_in_an_object_store(store_svc, jax_caches):
    client, url = store_svc
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
    before = _blobs(url)
    applied = _prune(client, {"unused_for": "1s", "min_age": 0}, apply=True, cache="prod")
    assert applied["deleted"] == len(unhit)
    assert before - _blobs(url) == {f"{key}-cache" for key in unhit}
