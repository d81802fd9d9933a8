"""A job's working set read from a root's records (``jaxcache.working_set.from_root``): which runs and warm-ups
count, in which order their keys come, and what is left out. Records are written as the client and warm-up write
them; no JAX is needed to say which keys they name."""

from __future__ import annotations

import pytest

from jaxcache import coverage, records
from jaxcache.errors import InvalidInputError
from jaxcache.storage import LocalStorage
from jaxcache.working_set import Wanted, WorkingSet, from_root
from working_set_support import CPU4, CPU8, NOW, OLD, key, put_run, put_warmup, use


@pytest.fixture
def root(tmp_path) -> LocalStorage:
    return LocalStorage(str(tmp_path))


def test_the_newest_matching_runs_give_their_hits_and_writes_in_order_of_first_use(root):
    put_run(root, "r3", CPU8, [use(3, at=5), use(1, records.WRITE, at=1), use(9, records.COMPILED, at=0)])
    put_run(root, "r2", CPU8, [use(2), use(1)], ago_s=3600)
    put_run(root, "r1", CPU8, [use(7)], ago_s=7200)
    got = from_root(root, "train", Wanted(jaxlib="0.10.2"), runs=2, now=NOW)
    assert got.runs == ["r3", "r2"]
    assert got.keys == [key(1), key(3), key(2)]  # key 9 was only compiled: nothing stored to fetch
    assert got.sha256 == {key(1): f"{1:064x}"}
    assert got.fingerprint == CPU8


def test_unknown_fields_come_from_the_newest_matching_run_so_layouts_never_mix(root):
    put_run(root, "new4", CPU4, [use(4)])
    put_run(root, "old8", CPU8, [use(8)], ago_s=60)
    assert from_root(root, "train", Wanted(jaxlib="0.10.2"), now=NOW).keys == [key(4)]
    assert from_root(root, "train", Wanted.of(CPU8), now=NOW).keys == [key(8)]
    assert from_root(root, "train", Wanted.of(OLD), now=NOW).keys == []


def test_other_jobs_warmups_own_records_other_processes_and_old_days_are_left_out(root):
    put_run(root, "other", CPU8, [use(1)], job="eval")
    put_run(root, "w", CPU8, [use(2)], kind=records.WARMUP)
    put_run(root, "p1", CPU8, [use(3)], process=1)
    put_run(root, "ancient", CPU8, [use(4)], ago_s=30 * 86400)
    put_run(root, "mine", CPU8, [use(5)], ago_s=86400)
    assert from_root(root, "train", Wanted.of(CPU8), now=NOW).keys == [key(5)]


def test_warmups_add_what_their_coverage_says_is_there(root):
    put_run(root, "r", CPU8, [use(1)])
    put_warmup(root, "wu", CPU8, {2: coverage.WRITTEN, 3: coverage.PRESENT, 4: coverage.NOT_WRITTEN})
    put_warmup(root, "wu4", CPU4, {5: coverage.WRITTEN})
    put_warmup(root, "wu-other", CPU8, {6: coverage.WRITTEN}, job="eval")
    got = from_root(root, "train", Wanted(), now=NOW)
    assert got.keys == [key(1), key(2), key(3)]
    assert got.warmups == ["wu"]


def test_unreadable_records_are_passed_over(root):
    put_run(root, "good", CPU8, [use(1)], ago_s=10)
    bad = records.record_name("bad", 0, NOW)
    root.write_atomic(bad, b"{not json")
    assert from_root(root, "train", Wanted(), now=NOW).keys == [key(1)]


def test_the_set_round_trips_as_builtins_and_refuses_what_is_not_one(root):
    put_run(root, "r", CPU8, [use(1, records.WRITE), use(2)])
    got = from_root(root, "train", Wanted(), now=NOW)
    assert WorkingSet.from_builtins(got.to_builtins()) == got
    with pytest.raises(InvalidInputError, match="not a working set"):
        WorkingSet.from_builtins({"job": "train", "keys": ["../../etc/passwd"]})
