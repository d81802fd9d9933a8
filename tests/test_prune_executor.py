"""The executor on real directories and on each object store (fake-gcs-server, moto's S3, Azurite): it deletes
exactly the plan, with JAX's lock and the store's version preconditions, and survives its own crashes."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import upload_dir
from jaxcache import entry as fmt
from jaxcache.prune import (
    Candidate,
    Decision,
    PrunePlan,
    PrunePolicy,
    PruneResult,
    apply,
    plan,
)
from jaxcache.scan import Entry, Orphan, scan
from jaxcache.storage import open_storage
from prune_support import (
    DAY,
    ORPHAN_KEY,
    age_cache,
    keys,
    snapshot,
)
from store_servers import put_dir, raw_names

# --------------------------------------------------------------------------------------------------------------
# Candidates from a real scan, and the executor on a real directory




def test_candidates_from_a_real_scan(cache_copy, jax_caches):
    (cache_copy / f"{ORPHAN_KEY}-atime").write_bytes(fmt.encode_atime(1))
    records = list(scan(open_storage(str(cache_copy))))
    cands = {c.key: c for c in map(Candidate.from_record, records)}
    for r in records:
        c = cands[r.key]
        assert (c.module, c.name, c.size_bytes, c.created_s) == (r.module, r.name, r.size_bytes, r.mtime_s)
        if isinstance(r, Entry):
            assert not c.orphan and c.has_atime and c.status == "ok" and c.last_used_s == r.last_used_s
        else:
            assert isinstance(r, Orphan) and c.orphan and c.name == f"{ORPHAN_KEY}-atime" and c.status is None
    assert len(cands) == len(jax_caches["zstd"].entries) + 1


def test_apply_deletes_cache_and_atime_and_nothing_else(cache_copy):
    now = time.time()
    all_keys = age_cache(cache_copy, created_ago=10 * DAY, used_ago=5 * DAY, now=now)
    (cache_copy / f"{ORPHAN_KEY}-atime").write_bytes(fmt.encode_atime(1))
    os.utime(cache_copy / f"{ORPHAN_KEY}-atime", (now - DAY, now - DAY))
    before = snapshot(cache_copy)
    storage = open_storage(str(cache_copy))
    cands = [Candidate.from_record(r) for r in scan(storage)]
    p = plan(cands, PrunePolicy(functions=("jit_tiny", "jit_odd*"), orphans=True), now=now)
    assert len(p.delete) == 3
    seen: list[Decision] = []
    result = apply(storage, p, on_deleted=seen.append)
    assert result == PruneResult(deleted=3, bytes_freed=p.bytes_freed, already_gone=0, changed=0, errors=[])
    assert seen == p.delete  # in plan order, in this thread
    gone = {f"{d.candidate.key}-cache" for d in p.delete if not d.candidate.orphan}
    gone |= {f"{d.candidate.key}-atime" for d in p.delete}
    assert snapshot(cache_copy) == {k: v for k, v in before.items() if k not in gone}
    assert ".lockfile" in before and len(gone) == 5
    assert len(all_keys) - 2 == sum(1 for n in snapshot(cache_copy) if n.endswith("-cache"))


def test_apply_is_idempotent_after_a_crash_between_the_two_deletes(cache_copy, tmp_path):
    now = time.time()
    age_cache(cache_copy, created_ago=10 * DAY, used_ago=5 * DAY, now=now)
    clean = tmp_path / "clean"
    shutil.copytree(cache_copy, clean)
    policy = PrunePolicy(unused_for_s=DAY)

    def planned(root: Path) -> PrunePlan:
        return plan([Candidate.from_record(r) for r in scan(open_storage(str(root)))], policy, now=now)

    apply(open_storage(str(clean)), planned(clean))
    p = planned(cache_copy)
    # A crash half-way: some entries fully gone, one with only its -cache deleted.
    for d in p.delete[:2]:
        os.unlink(cache_copy / f"{d.candidate.key}-cache")
        os.unlink(cache_copy / f"{d.candidate.key}-atime")
    os.unlink(cache_copy / f"{p.delete[2].candidate.key}-cache")
    result = apply(open_storage(str(cache_copy)), p)
    assert (result.deleted, result.already_gone, result.errors) == (len(p.delete) - 3, 3, [])
    assert snapshot(cache_copy) == snapshot(clean)
    again = apply(open_storage(str(cache_copy)), p)
    assert (again.deleted, again.already_gone, again.bytes_freed) == (0, len(p.delete), 0)
    assert snapshot(cache_copy) == snapshot(clean)


def test_an_orphan_whose_entry_came_back_is_left_alone(cache_copy):
    now = time.time()
    age_cache(cache_copy, created_ago=10 * DAY, used_ago=5 * DAY, now=now)
    entry = next(p for p in sorted(cache_copy.iterdir()) if p.name.endswith("-cache"))
    key = entry.name[:-6]
    data = entry.read_bytes()
    entry.unlink()
    storage = open_storage(str(cache_copy))
    p = plan([Candidate.from_record(r) for r in scan(storage)], PrunePolicy(orphans=True), now=now)
    assert keys(p.delete) == [key]
    entry.write_bytes(data)  # a job wrote the key again (and its -atime) after the listing
    result = apply(storage, p)
    assert (result.deleted, result.changed) == (0, 1)
    assert (cache_copy / f"{key}-atime").exists()  # a -cache without its -atime would break JAX's LRU writes


def test_apply_reports_failures_and_keeps_going(cache_copy, tmp_path):
    now = time.time()
    age_cache(cache_copy, created_ago=10 * DAY, used_ago=5 * DAY, now=now)
    storage = open_storage(str(cache_copy))
    p = plan([Candidate.from_record(r) for r in scan(storage)], PrunePolicy(unused_for_s=0), now=now)
    victim = p.delete[0].candidate
    # A directory where the -cache name is taken by a non-empty directory: unlink fails for real.
    os.unlink(cache_copy / victim.name)
    (cache_copy / victim.name).mkdir()
    (cache_copy / victim.name / "x").write_text("x")
    result = apply(storage, p)
    assert result.deleted == len(p.delete) - 1 and len(result.errors) == 1
    assert victim.name in result.errors[0] and "under" in result.errors[0]
    assert (cache_copy / f"{victim.key}-atime").exists()  # the entry is still there: so is its -atime


def test_apply_waits_for_jax_lru_lock(cache_copy):
    """Deletions take JAX's own LRU lock (filelock on .lockfile), so they never interleave with JAX's eviction."""
    import threading

    import filelock

    now = time.time()
    age_cache(cache_copy, created_ago=10 * DAY, used_ago=5 * DAY, now=now)
    assert (cache_copy / ".lockfile").exists()  # JAX's LRU was on when this cache was written
    storage = open_storage(str(cache_copy))
    p = plan([Candidate.from_record(r) for r in scan(storage)], PrunePolicy(older_than_s=0), now=now)
    jax_lock = filelock.FileLock(str(cache_copy / ".lockfile"))  # what JAX's LRUCache holds around get/put
    results: list[PruneResult] = []
    with jax_lock:
        worker = threading.Thread(target=lambda: results.append(apply(storage, p)))
        worker.start()
        worker.join(0.3)
        # While JAX holds its lock nothing may be deleted (if apply ignored the lock it would be done by now).
        assert worker.is_alive()
        assert sum(1 for n in os.listdir(cache_copy) if n.endswith("-cache")) == len(p.delete)
    worker.join(60)
    assert results and results[0].deleted == len(p.delete)
    assert not [n for n in os.listdir(cache_copy) if n.endswith(("-cache", "-atime"))]
    # The run holds the lock across a few entries at a time, never past its end: JAX gets it at once afterwards.
    jax_lock.acquire(timeout=0)
    jax_lock.release()


# --------------------------------------------------------------------------------------------------------------
# GCS (fake-gcs-server)


def _listing(root: str) -> dict[str, bytes]:
    """Every object under an object-store root and its bytes, as the store's own client library lists them."""
    names = raw_names(root)
    storage = open_storage(root)
    return {name: storage.read(name) for name in names}


def test_apply_deletes_exactly_the_plan_in_an_object_store(store_root, cache_copy):
    odd = [p.name[:-6] for p in sorted(cache_copy.iterdir()) if p.name.startswith(("jit_tiny-", "jit_odd"))
           and p.name.endswith("-cache")]
    pinned = next(p.name[:-6] for p in sorted(cache_copy.iterdir()) if p.name.startswith("jit__lambda-"))
    (cache_copy / f"{ORPHAN_KEY}-atime").write_bytes(fmt.encode_atime(1))
    put_dir(store_root, cache_copy)
    before = _listing(store_root)
    storage = open_storage(store_root)
    cands = [Candidate.from_record(r) for r in scan(storage)]
    assert all(c.version for c in cands) and len(odd) == 2
    # Uploaded just now (the store sets the time), so the grace period is turned off.
    policy = PrunePolicy(functions=("jit_tiny", "jit_odd*", "jit__lambda"), orphans=True, keep=(pinned,), min_age_s=0)
    p = plan(cands, policy, now=time.time())
    assert set(keys(p.delete)) == {*odd, ORPHAN_KEY} and keys(p.protected) == [pinned]
    result = apply(storage, p)
    assert (result.deleted, result.already_gone, result.changed, result.errors) == (3, 0, 0, [])
    gone = {f"{k}-cache" for k in odd} | {f"{k}-atime" for k in [*odd, ORPHAN_KEY]}
    assert _listing(store_root) == {k: v for k, v in before.items() if k not in gone}
    again = apply(storage, p)
    assert (again.deleted, again.already_gone) == (0, 3)


@pytest.mark.parametrize("store_root", [
    pytest.param("gs", marks=pytest.mark.xfail(strict=True, reason=(
        "fake-gcs-server ignores ifGenerationMatch on deletes: that the prune sends the listed generation is "
        "test_gcs_deletes_carry_the_generation_precondition"))),
    "s3", "az"], indirect=True)
def test_a_prune_racing_a_rewrite_leaves_the_new_object(store_root, cache_copy):
    """A key is written again between the prune's listing and its delete (by a job, with other bytes): the store's
    own precondition (GCS's generation, If-Match on S3 and Azure) refuses the delete, so the new object stays and is
    counted changed, and everything else the plan names goes."""
    put_dir(store_root, cache_copy)
    storage = open_storage(store_root)
    p = plan([Candidate.from_record(r) for r in scan(storage)], PrunePolicy(functions=("*",), min_age_s=0),
             now=time.time())
    victim = next(d.candidate for d in p.delete if not d.candidate.orphan)
    rewritten = storage.read(victim.name)[::-1]  # not what was listed: another version, whatever the store
    storage.write_atomic(victim.name, rewritten)
    result = apply(storage, p)
    assert (result.changed, result.deleted, result.errors) == (1, len(p.delete) - 1, []), result
    assert storage.read(victim.name) == rewritten
    assert {o.name for o in storage.iter_objects()} >= {victim.name}
    assert not [d for d in p.delete if d.candidate is not victim and storage.exists(d.candidate.name)]


def test_gcs_deletes_carry_the_generation_precondition(gcs_client, gcs_bucket, cache_copy):
    # Neither emulator enforces delete preconditions, so check the requests themselves.
    upload_dir(gcs_client, gcs_bucket, "c", cache_copy)
    storage = open_storage(f"gs://{gcs_bucket}/c")
    cands = [Candidate.from_record(r) for r in scan(storage)]
    one = cands[0]
    atime_gen = storage.stat(f"{one.key}-atime").version
    cands[0] = Candidate(**{**{f: getattr(one, f) for f in one.__slots__}, "atime_version": atime_gen})
    p = plan(cands, PrunePolicy(functions=("*",), min_age_s=0), now=time.time())
    seen: list[str] = []
    session = storage._client._http
    hook = lambda response, *a, **k: seen.append(f"{response.request.method} {response.request.url}")  # noqa: E731
    session.hooks["response"].append(hook)
    try:
        result = apply(storage, p)
    finally:
        session.hooks["response"].remove(hook)
    assert result.deleted == len(cands) and not result.errors
    deletes = [s for s in seen if s.startswith("DELETE ")]
    # Each entry's -cache, its -atime and its -sig (a signature goes with its entry; none here: already gone).
    assert len(deletes) == 3 * len(cands)
    for c in cands:
        assert len([s for s in deletes if f"{c.key}-sig" in s]) == 1
        cache_req = [s for s in deletes if f"{c.key}-cache" in s]
        assert len(cache_req) == 1 and f"ifGenerationMatch={c.version}" in cache_req[0]
        atime_req = [s for s in deletes if f"{c.key}-atime" in s]
        assert len(atime_req) == 1
        if c.atime_version is None:
            assert "ifGenerationMatch" not in atime_req[0]
        else:
            assert f"ifGenerationMatch={atime_gen}" in atime_req[0]
    assert _listing(f"gs://{gcs_bucket}/c") == {".lockfile": b""}
