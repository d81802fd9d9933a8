"""Prune rules fed by run records: last hits in LRU (`max_total_bytes`, `unused_for`) and `stale_jaxlib`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time

import pytest

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.prune import Candidate, PrunePolicy, plan, policy_from_mapping

NOW = 1_800_000_000.0
DAY = 86400.0


def cand(n: int, *, created_ago: float = 30 * DAY, hit_ago: float | None = None, jaxlib: str | None = None,
         size: int = 100) -> Candidate:
    key = f"jit_f-{hashlib.sha256(str(n).encode()).hexdigest()}"
    return Candidate(
        key=key, module="jit_f", name=key + "-cache", size_bytes=size, created_s=NOW - created_ago,
        last_used_s=NOW - created_ago, status="ok",
        last_hit_s=None if hit_ago is None else NOW - hit_ago, writer_jaxlib=jaxlib,
    )


def deleted(p) -> list[str]:
    return [d.candidate.key for d in p.delete]


def test_last_use_is_the_newest_of_atime_hit_and_creation():
    c = cand(0, created_ago=10 * DAY, hit_ago=2 * DAY)
    assert c.last_use_s == NOW - 2 * DAY
    assert dataclasses.replace(c, last_hit_s=NOW - 20 * DAY).last_use_s == NOW - 10 * DAY
    assert dataclasses.replace(c, last_hit_s=None).last_use_s == NOW - 10 * DAY


def test_unused_for_counts_hits():
    hit, idle = cand(0, hit_ago=1 * DAY), cand(1)
    p = plan([hit, idle], PrunePolicy(unused_for_s=7 * DAY), now=NOW)
    assert deleted(p) == [idle.key]
    assert p.delete[0].reasons == ("unused for 30d",)


def test_max_total_bytes_evicts_by_last_hit():
    # No -atime anywhere (a GCS root): creation alone would evict in key order; hits decide instead.
    a, b, c = cand(0, hit_ago=3 * DAY), cand(1, hit_ago=1 * DAY), cand(2, hit_ago=2 * DAY)
    p = plan([a, b, c], PrunePolicy(max_total_bytes=100), now=NOW)
    assert deleted(p) == [a.key, c.key]
    assert p.bytes_remaining == 100


def test_stale_jaxlib_selects_writers_not_seen_recently():
    old, current, unknown = cand(0, jaxlib="0.4.30"), cand(1, jaxlib="0.5.0"), cand(2)
    policy = PrunePolicy(stale_jaxlib=True)
    p = plan([old, current, unknown], policy, now=NOW, recent_jaxlibs={"0.5.0"})
    assert deleted(p) == [old.key]
    assert p.delete[0].reasons == ("written by jaxlib 0.4.30, which no run used in the last 14d",)
    assert p.notes == []


@pytest.mark.parametrize("recent", [None, set(), ()])
def test_stale_jaxlib_without_recent_runs_selects_nothing_and_says_so(recent):
    p = plan([cand(0, jaxlib="0.4.30")], PrunePolicy(stale_jaxlib=True), now=NOW, recent_jaxlibs=recent)
    assert p.delete == [] and p.kept == 1
    assert len(p.notes) == 1 and "no run records from the last 14d" in p.notes[0]


def test_stale_jaxlib_respects_keep_rules():
    young = cand(0, created_ago=60, jaxlib="0.4.30")
    pinned = cand(1, jaxlib="0.4.30")
    p = plan([young, pinned], PrunePolicy(stale_jaxlib=True, keep=(pinned.key,)), now=NOW, recent_jaxlibs={"0.5"})
    assert p.delete == [] and {d.candidate.key for d in p.protected} == {young.key, pinned.key}


def test_policy_fields():
    p = policy_from_mapping({"stale_jaxlib": True, "stale_jaxlib_window": "3d"})
    assert p.stale_jaxlib and p.stale_jaxlib_window_s == 3 * DAY and p.selects_anything()
    assert policy_from_mapping({"stale_jaxlib": True}).stale_jaxlib_window_s == 14 * DAY
    assert p.as_dict()["stale_jaxlib_window"] == 3 * DAY
    assert not PrunePolicy().selects_anything()
    for bad in ({"stale_jaxlib": "yes"}, {"stale_jaxlib": True, "stale_jaxlib_window": "soon"},
                {"stale_jaxlib": True, "stale_jaxlib_window": -1}, {"stale_jaxlib_window": "3d"},
                {"stale_jaxlibs": True}):
        with pytest.raises(InvalidInputError):
            policy_from_mapping(bad)


# --------------------------------------------------------------------------------------------------------------
# `jaxcache prune` reads the root's run records itself


def _cli_plan(capsys, *args: str) -> dict:
    from jaxcache.cli import main

    assert main(["prune", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_prune_uses_run_records(cache_copy, jax_caches, capsys):
    from reports_support import NEW, OLD, age, hit, keys_of, put_record, run, write

    age(cache_copy, 10)
    k = keys_of(jax_caches["zstd"])
    now = time.time()
    train, tiny, odd = k["jit_train_step"], k["jit_tiny"], k["jit_odd-name.v2"]
    put_record(cache_copy, run("old", "o1", [write(train, 5.0, now - 21 * DAY), write(tiny, 1.0, now - 21 * DAY)],
                               at=now - 20 * DAY, jaxlib=OLD))
    put_record(cache_copy, run("new", "n1", [write(k["rest"][0], 2.0, now - 3600), hit(odd, 2, now - DAY)],
                               jaxlib=NEW))
    broken = cache_copy / records.RUNS_PREFIX / "2026-01-01" / "x-p0.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{")

    out = _cli_plan(capsys, str(cache_copy), "--stale-jaxlib")
    assert {d["key"] for d in out["delete"]} == {train, tiny} and out["notes"] == []
    assert out["run_records"]["read"] == 2 and out["run_records"]["malformed"] == [str(broken.relative_to(cache_copy))]
    assert _cli_plan(capsys, str(cache_copy), "--stale-jaxlib", "--stale-jaxlib-window", "30d")["delete"] == []

    out = _cli_plan(capsys, str(cache_copy), "--unused-for", "5d")
    assert odd not in {d["key"] for d in out["delete"]} and len(out["delete"]) == len(k["all"]) - 1

    from jaxcache.cli import main

    assert main(["prune", str(cache_copy), "--stale-jaxlib-window", "3d"]) == 2
    capsys.readouterr()
    assert main(["prune", str(cache_copy), "--stale-jaxlib"]) == 0
    text = capsys.readouterr()
    assert "would delete 2 entries" in text.out and "skipping malformed run record" in text.err


def test_cli_prune_does_not_count_a_warmups_hits_as_use(cache_copy, jax_caches, capsys):
    from reports_support import age, hit, keys_of, put_record, run, write

    age(cache_copy, 10)
    k = keys_of(jax_caches["zstd"])
    now = time.time()
    tiny, odd = k["jit_tiny"], k["jit_odd-name.v2"]
    put_record(cache_copy, run("warmup", "w1", [write(tiny, 1.0, now - 3600)], kind="warmup"))
    put_record(cache_copy, run("warmup", "w1-verify", [hit(tiny, 1, now - 3000), hit(odd, 1, now - 3000)],
                               kind="warmup-verify"))
    # Its jaxlib counts as in use, though: a warm-up for a new jaxlib runs before its jobs do.
    out = _cli_plan(capsys, str(cache_copy), "--stale-jaxlib")
    assert out["delete"] == [] and out["notes"] == []
    put_record(cache_copy, run("train", "j1", [hit(odd, 1, now - DAY)]))
    out = _cli_plan(capsys, str(cache_copy), "--unused-for", "5d")
    gone = {d["key"] for d in out["delete"]}
    assert tiny in gone and odd not in gone, "only the job's hit is use"


def test_cli_prune_without_recent_runs_says_so(cache_copy, capsys):
    out = _cli_plan(capsys, str(cache_copy), "--stale-jaxlib")
    assert out["delete"] == [] and "no run records" in out["notes"][0]


def test_cli_prune_in_an_object_store_evicts_by_last_hit(tmp_path, store_root, jax_caches, capsys):
    from jaxcache.storage import open_storage
    from reports_support import hit, keys_of, run
    from store_servers import put_dir, raw_put

    src = tmp_path / "src"
    shutil.copytree(jax_caches["zlib"].root, src)
    for p in src.iterdir():
        if p.name.endswith("-atime") or p.name == ".lockfile":
            p.unlink()
    put_dir(store_root, src)
    k = keys_of(jax_caches["zlib"])
    tiny, odd = k["jit_tiny"], k["jit_odd-name.v2"]
    objects = list(open_storage(store_root).iter_objects())
    created = max(o.mtime_s for o in objects)
    size = {o.name[:-len("-cache")]: o.size_bytes for o in objects if o.name.endswith("-cache")}
    # Hits dated after the upload (the servers cannot backdate objects): they alone order the entries.
    rec = run("a", "r1", [hit(odd, 1, created + 3600), hit(tiny, 1, created + 7200)], at=created + 7200)
    raw_put(store_root, rec.name, rec.to_json())
    url = store_root
    out = _cli_plan(capsys, url, "--max-size", str(size[tiny]), "--min-age", "0s")
    order = [d["key"] for d in out["delete"]]
    assert order[-1] == odd and set(order) == set(k["all"]) - {tiny}
    out = _cli_plan(capsys, url, "--max-size", str(size[tiny] + size[odd]), "--min-age", "0s")
    assert {d["key"] for d in out["delete"]} == set(k["all"]) - {tiny, odd}
