"""Prune rules fed by run records: last hits in LRU (`max_total_bytes`, `unused_for`) and `stale_jaxlib`."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
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
