"""A prune's candidates straight from a listing (the columns `jaxcache prune` plans from without --corrupt) are the
candidates the scan's records make, jams and all, and plans of them are the same plans."""

from __future__ import annotations

import os
import time

import pytest

import test_hostile_root
from jaxcache import entry as fmt
from jaxcache.prune import Candidate, PrunePolicy, plan
from jaxcache.prune.listed import listed_candidates
from jaxcache.scan import scan
from jaxcache.storage.local import LocalStorage
from jaxcache.usage import RecordedUse
from test_hostile_root import DAY, key_of

hostile = test_hostile_root.hostile  # the fixture

POLICIES = [
    PrunePolicy(unused_for_s=30 * DAY), PrunePolicy(unused_for_s=0, min_age_s=0, keep=("jit_train*",)),
    PrunePolicy(orphans=True, older_than_s=DAY), PrunePolicy(max_total_bytes=1, functions=("jit_tiny",)),
    PrunePolicy(stale_jaxlib=True, min_age_s=0), PrunePolicy(max_total_bytes=0, min_age_s=45 * DAY),
]


@pytest.fixture
def odd_root(hostile):
    """The hostile root, plus an orphaned -atime, names like entries that JAX did not write, and a fresh entry."""
    root = hostile["root"]
    (root / (key_of("jit_gone", "8") + "-atime")).write_bytes(fmt.encode_atime(time.time_ns()))
    (root / "notes-cache").write_bytes(b"not JAX's")
    (root / f"jit_f-{'A' * 64}-cache").write_bytes(b"upper-case hex: not JAX's either")
    fresh = root / (key_of("jit_fresh", "9") + "-cache")
    fresh.write_bytes(b"")
    os.utime(fresh, (time.time() - 60, time.time() - 60))
    return hostile


def test_listed_candidates_are_the_scans(odd_root):
    entries = odd_root["entries"]
    use = RecordedUse(last_hit_s={entries[0]: time.time() - DAY, key_of("jit_gone", "8"): time.time()},
                      writer_jaxlib={entries[1]: "0.4.30", entries[2]: "0.5.0"})
    scanned, listed = LocalStorage(odd_root["root"]), LocalStorage(odd_root["root"])
    want = sorted((use.apply_to(Candidate.from_record(r)) for r in scan(scanned, read_headers=False)),
                  key=lambda c: c.name)
    got = listed_candidates(listed, hits=use.last_hit_s, writers=use.writer_jaxlib)
    assert sorted(got, key=lambda c: c.name) == want
    assert any(c.orphan for c in want) and any(c.has_atime for c in want) and any(c.last_hit_s for c in want)
    assert listed.skipped.items() == scanned.skipped.items() and listed.skipped.count == scanned.skipped.count
    assert {name for name, _ in listed.skipped.items()} == set(odd_root["skipped"])


@pytest.mark.parametrize("policy", POLICIES, ids=range(len(POLICIES)))
def test_a_plan_of_the_columns_is_the_plan_of_the_candidates(odd_root, policy):
    entries = odd_root["entries"]
    columns = listed_candidates(LocalStorage(odd_root["root"]), hits={entries[3]: time.time() - 2 * DAY},
                                writers={entries[1]: "0.4.30", entries[2]: "0.5.0"})
    now = time.time()
    a = plan(columns, policy, now=now, recent_jaxlibs={"0.5.0"})
    b = plan(list(columns), policy, now=now, recent_jaxlibs={"0.5.0"})
    assert list(a.delete) == list(b.delete) and a.delete == b.delete and list(a.protected) == list(b.protected)
    assert (a.kept, a.bytes_freed, a.bytes_remaining, a.entries_total, a.notes) == (
        b.kept, b.bytes_freed, b.bytes_remaining, b.entries_total, b.notes)
    assert a.delete[:2] == list(b.delete)[:2] and len(a.delete) == len(b.delete)
