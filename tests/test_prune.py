"""Prune: the pure policy, policy parsing, the executor on real directories and GCS, the CLI, crashes, live jobs."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from conftest import TESTS, upload_dir
from jaxcache import entry as fmt
from jaxcache.cli import main
from jaxcache.errors import InvalidInputError
from jaxcache.prune import (
    Candidate,
    Decision,
    PrunePlan,
    PrunePolicy,
    PruneResult,
    apply,
    plan,
    policy_from_mapping,
)
from jaxcache.scan import Entry, Orphan, scan
from jaxcache.storage import open_storage

NOW = 1_800_000_000.0
DAY = 86400.0
HOUR = 3600.0
JOB = TESTS / "programs" / "jax_job.py"


# --------------------------------------------------------------------------------------------------------------
# Helpers


def cand(
    module: str = "jit_f", n: int = 0, *, size: int = 100, created_ago: float = 30 * DAY,
    used_ago: float | None = None, status: str | None = "ok", orphan: bool = False,
) -> Candidate:
    """A candidate with a real-shaped key; ages are relative to NOW."""
    key = f"{module}-{hashlib.sha256(f'{module}{n}'.encode()).hexdigest()}"
    used = created_ago if used_ago is None else used_ago
    return Candidate(
        key=key, module=module, name=key + ("-atime" if orphan else "-cache"), size_bytes=size,
        created_s=NOW - created_ago, last_used_s=NOW - used, status=None if orphan else status, orphan=orphan,
        has_atime=not orphan,
    )


def keys(decisions: list[Decision]) -> list[str]:
    return [d.candidate.key for d in decisions]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative name → bytes): the full state a prune may change."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def age_cache(root: Path, *, created_ago: float, used_ago: dict[str, float] | float, now: float) -> list[str]:
    """Set every entry's mtime and ``-atime`` content explicitly; returns the keys."""
    found = sorted(p.name[:-6] for p in root.iterdir() if p.name.endswith("-cache"))
    for key in found:
        ago = used_ago if isinstance(used_ago, float | int) else used_ago.get(key, created_ago)
        (root / f"{key}-atime").write_bytes(fmt.encode_atime(int((now - ago) * 1e9)))
        for suffix in ("-cache", "-atime"):
            os.utime(root / f"{key}{suffix}", (now - created_ago, now - created_ago))
    return found


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def small_sources(cache_dir: str | Path, limit_bytes: int = 64 * 1024) -> list[tuple[str, bytes]]:
    """(module, bytes) of the real entries in a cache that are small enough to copy thousands of times."""
    found = []
    for p in sorted(Path(cache_dir).iterdir()):
        parsed = fmt.parse_name(p.name)
        if parsed is not None and parsed.kind is fmt.EntryKind.CACHE and p.stat().st_size <= limit_bytes:
            found.append((parsed.module, p.read_bytes()))
    assert found
    return found


def build_synthetic(root: Path, sources: list[tuple[str, bytes]], n: int, now: float) -> None:
    """``n`` real-format entries under distinct keys, each with an ``-atime``; deterministic ages.

    Entry ``i``: created 60 days ago; last used ``i % 30`` days (plus ``i`` seconds) ago.
    """
    root.mkdir()
    for i in range(n):
        module, data = sources[i % len(sources)]
        key = f"{module}-{hashlib.sha256(str(i).encode()).hexdigest()}"
        (root / f"{key}-cache").write_bytes(data)
        (root / f"{key}-atime").write_bytes(fmt.encode_atime(int((now - (i % 30) * DAY - i) * 1e9)))
        for suffix in ("-cache", "-atime"):
            os.utime(root / f"{key}{suffix}", (now - 60 * DAY, now - 60 * DAY))


# --------------------------------------------------------------------------------------------------------------
# The pure policy


def test_a_policy_without_selecting_rules_selects_nothing():
    policy = PrunePolicy(keep=("jit_*",), min_age_s=0)
    assert not policy.selects_anything()
    p = plan([cand(n=i, used_ago=100 * DAY) for i in range(5)] + [cand(orphan=True)], policy, now=NOW)
    assert p.delete == [] and p.protected == [] and p.kept == 6 and p.bytes_freed == 0
    for rule in (
        {"max_total_bytes": 0}, {"unused_for_s": 0}, {"older_than_s": 0}, {"functions": ("x",)},
        {"corrupt": True}, {"orphans": True},
    ):
        assert PrunePolicy(**rule).selects_anything(), rule


def test_unused_for():
    old, recent = cand(n=1, used_ago=20 * DAY), cand(n=2, used_ago=5 * DAY)
    p = plan([old, recent], PrunePolicy(unused_for_s=14 * DAY), now=NOW)
    assert keys(p.delete) == [old.key] and p.kept == 1
    assert p.delete[0].reasons == ("unused for 20d",)


def test_older_than_uses_creation_not_last_use():
    made_long_ago_used_now = cand(n=1, created_ago=40 * DAY, used_ago=60)
    fresh = cand(n=2, created_ago=2 * DAY)
    p = plan([made_long_ago_used_now, fresh], PrunePolicy(older_than_s=30 * DAY), now=NOW)
    assert keys(p.delete) == [made_long_ago_used_now.key]
    assert p.delete[0].reasons == ("created 40d ago",)


def test_functions_match_module_globs():
    train, evals, odd = cand("jit_train_step", 1), cand("jit_eval", 2), cand("jit_odd-name.v2", 3)
    p = plan([train, evals, odd], PrunePolicy(functions=("jit_train*", "jit_odd-*.v2")), now=NOW)
    assert set(keys(p.delete)) == {train.key, odd.key}
    assert dict(zip(keys(p.delete), (d.reasons for d in p.delete), strict=True))[train.key] == (
        "function matches 'jit_train*'",
    )
    # A glob over the function never matches on the hash part of the key.
    assert plan([train], PrunePolicy(functions=(train.key[-64:],)), now=NOW).delete == []


def test_corrupt_selects_only_corrupt_status():
    bad, good, unknown = cand(n=1, status="corrupt"), cand(n=2, status="ok"), cand(n=3, status=None)
    p = plan([bad, good, unknown], PrunePolicy(corrupt=True), now=NOW)
    assert keys(p.delete) == [bad.key] and p.delete[0].reasons == ("corrupt",)


def test_orphans_are_selected_only_by_orphans():
    orphan = cand("jit_gone", 1, size=8, orphan=True, created_ago=90 * DAY)
    entry = cand("jit_gone", 2, used_ago=90 * DAY)
    everything_but_orphans = PrunePolicy(
        max_total_bytes=0, unused_for_s=0, older_than_s=0, functions=("*",), corrupt=True,
    )
    p = plan([orphan, entry], everything_but_orphans, now=NOW)
    assert keys(p.delete) == [entry.key] and p.kept == 1
    p = plan([orphan, entry], PrunePolicy(orphans=True), now=NOW)
    assert keys(p.delete) == [orphan.key] and p.delete[0].reasons == ("orphaned -atime file",)
    # Keep rules hold for orphans too.
    young = cand("jit_gone", 3, size=8, orphan=True, created_ago=60)
    pinned = cand("jit_pinned", 4, size=8, orphan=True)
    p = plan([young, pinned], PrunePolicy(orphans=True, keep=("jit_pinned",)), now=NOW)
    assert p.delete == [] and {d.reasons for d in p.protected} == {
        ("younger than min_age 1h",), ("pinned by 'jit_pinned'",),
    }


def test_any_rule_selects_and_reasons_accumulate():
    both = cand("jit_old", 1, used_ago=20 * DAY, status="corrupt")
    one = cand("jit_new", 2, used_ago=1 * DAY, status="corrupt")
    none = cand("jit_new", 3, used_ago=1 * DAY)
    p = plan([both, one, none], PrunePolicy(unused_for_s=14 * DAY, corrupt=True, functions=("jit_old",)), now=NOW)
    by_key = {d.candidate.key: d.reasons for d in p.delete}
    assert by_key == {
        both.key: ("unused for 20d", "function matches 'jit_old'", "corrupt"),
        one.key: ("corrupt",),
    }
    assert p.kept == 1


def test_min_age_protects_fresh_entries():
    fresh = cand(n=1, created_ago=30 * 60, used_ago=30 * 60, status="corrupt")
    old = cand(n=2, created_ago=2 * HOUR, status="corrupt")
    p = plan([fresh, old], PrunePolicy(corrupt=True), now=NOW)
    assert keys(p.delete) == [old.key]
    assert keys(p.protected) == [fresh.key] and p.protected[0].reasons == ("younger than min_age 1h",)
    p = plan([fresh, old], PrunePolicy(corrupt=True, min_age_s=0), now=NOW)
    assert set(keys(p.delete)) == {fresh.key, old.key} and p.protected == []
    # min_age counts from creation: a long-unused entry created a minute ago is still protected.
    just_made = cand(n=3, created_ago=60, used_ago=60)
    assert keys(plan([just_made], PrunePolicy(older_than_s=0), now=NOW).protected) == [just_made.key]


def test_pins_by_exact_key_and_by_glob_over_key_or_function():
    a, b, c, d = (cand("jit_train_step", 1), cand("jit_eval", 2), cand("jit_eval", 3), cand("jit_misc", 4))
    policy = PrunePolicy(older_than_s=0, keep=(a.key, "jit_eval-" + b.key[-64:-50] + "*", "jit_mi?c"))
    p = plan([a, b, c, d], policy, now=NOW)
    assert keys(p.delete) == [c.key]
    assert {x.candidate.key: x.reasons for x in p.protected} == {
        a.key: (f"pinned by {a.key!r}",),
        b.key: (f"pinned by {'jit_eval-' + b.key[-64:-50] + '*'!r}",),
        d.key: ("pinned by 'jit_mi?c'",),
    }
    # Pins and the grace period both show when both apply.
    young = cand("jit_misc", 5, created_ago=60)
    assert plan([young], policy, now=NOW).protected[0].reasons == ("pinned by 'jit_mi?c'", "younger than min_age 1h")


def test_max_total_bytes_evicts_least_recently_used_exactly_down_to_the_limit():
    sizes = [700, 300, 500, 200, 900, 100, 400, 600]
    cands = [cand(n=i, size=s, used_ago=(10 - i) * DAY) for i, s in enumerate(sizes)]  # n=0 is the oldest use
    total = sum(sizes)
    for limit in (total, total - 1, 2500, 1700, 1, 0):
        p = plan(list(reversed(cands)), PrunePolicy(max_total_bytes=limit), now=NOW)
        evicted = keys(p.delete)
        n = len(evicted)
        assert evicted == [c.key for c in cands[:n]], limit  # a prefix of the LRU order, oldest first
        assert p.bytes_remaining == total - sum(sizes[:n]) <= limit
        if n:
            assert p.bytes_remaining + sizes[n - 1] > limit  # one fewer eviction would not have been enough
        assert all(d.reasons == ("over max_total_bytes",) for d in p.delete)
        assert p.bytes_freed + p.bytes_remaining == total and p.kept + n == len(cands)


def test_max_total_bytes_ties_break_by_key():
    same_time = [cand(n=i, size=100, used_ago=DAY) for i in range(6)]
    p = plan(same_time, PrunePolicy(max_total_bytes=300), now=NOW)
    assert keys(p.delete) == sorted(c.key for c in same_time)[:3]


def test_max_total_bytes_counts_other_rules_first_and_protected_entries_toward_the_total():
    pinned = cand("jit_keep", 0, size=1000, used_ago=50 * DAY)  # the oldest, but pinned
    corrupt = cand("jit_f", 1, size=800, used_ago=1 * DAY, status="corrupt")  # the newest, but picked anyway
    rest = [cand("jit_f", i, size=300, used_ago=(20 - i) * DAY) for i in range(2, 8)]
    everything = [pinned, corrupt, *rest]  # 1000 + 800 + 1800 = 3600
    p = plan(everything, PrunePolicy(max_total_bytes=2200, corrupt=True, keep=("jit_keep",)), now=NOW)
    # corrupt frees 800 → 2800; then LRU: pinned skipped, rest[0] and rest[1] (600) → 2200.
    assert set(keys(p.delete)) == {corrupt.key, rest[0].key, rest[1].key}
    assert keys(p.protected) == [pinned.key] and p.protected[0].reasons == ("pinned by 'jit_keep'",)
    assert p.bytes_remaining == 2200 and p.kept == 4
    # An unreachable limit evicts every unprotected entry and says what stood in the way.
    p = plan(everything, PrunePolicy(max_total_bytes=500, keep=("jit_keep",)), now=NOW)
    assert p.bytes_remaining == 1000 and keys(p.protected) == [pinned.key] and len(p.delete) == 7


def test_plan_orders_deletions_least_recently_used_first_and_accounts_for_every_candidate():
    cands = [cand(n=i, size=10 + i, used_ago=((i * 7) % 13) * DAY, created_ago=20 * DAY) for i in range(13)]
    cands.append(cand(n=99, created_ago=60))  # protected by min_age
    p = plan(cands, PrunePolicy(unused_for_s=5 * DAY, older_than_s=0), now=NOW)
    used = [d.candidate.last_used_s for d in p.delete]
    assert used == sorted(used)
    assert p.entries_total == len(cands) == len(p.delete) + len(p.protected) + p.kept
    assert p.bytes_freed == sum(d.candidate.size_bytes for d in p.delete)
    assert p.bytes_freed + p.bytes_remaining == sum(c.size_bytes for c in cands)


def test_plan_accepts_any_iterable():
    p = plan((cand(n=i, used_ago=30 * DAY) for i in range(3)), PrunePolicy(unused_for_s=DAY), now=NOW)
    assert len(p.delete) == 3


# --------------------------------------------------------------------------------------------------------------
# Policies from user input


def test_policy_from_mapping_reads_sizes_durations_and_lists():
    policy = policy_from_mapping({
        "max_total_bytes": "50GiB", "unused_for": "14d", "older_than": 86400, "functions": ["jit_old*"],
        "corrupt": True, "orphans": False, "keep": "jit_train*", "min_age": "30m",
    })
    assert policy == PrunePolicy(
        max_total_bytes=50 * 1024**3, unused_for_s=14 * DAY, older_than_s=DAY, functions=("jit_old*",),
        corrupt=True, orphans=False, keep=("jit_train*",), min_age_s=1800,
    )
    assert policy_from_mapping({}) == PrunePolicy()
    assert policy_from_mapping({"max_total_bytes": None, "unused_for": None}) == PrunePolicy()
    assert policy_from_mapping({"max_total_bytes": 1000, "min_age": 0}) == PrunePolicy(
        max_total_bytes=1000, min_age_s=0
    )


def test_policy_from_mapping_rejects_unknown_fields():
    with pytest.raises(InvalidInputError, match="unknown prune policy field 'unused_fro'.*did you mean 'unused_for'"):
        policy_from_mapping({"unused_fro": "14d"})
    with pytest.raises(InvalidInputError, match="unknown prune policy field 'max_total_bytes_s'"):
        policy_from_mapping({"max_total_bytes_s": 1, "unused_for": "1d"})
    with pytest.raises(InvalidInputError, match="unknown prune policy field 'unused_for_s'"):
        policy_from_mapping({"unused_for_s": 100})  # the dataclass's name is not the mapping's


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"max_total_bytes": "50XB"}, "'max_total_bytes'.*'50XB' is not a size"),
        ({"max_total_bytes": -1}, "'max_total_bytes' must be 0 or more"),
        ({"max_total_bytes": 1.5}, "'max_total_bytes' must be a whole number of bytes"),
        ({"max_total_bytes": True}, "'max_total_bytes' must be a whole number of bytes"),
        ({"unused_for": "14 days"}, "'unused_for'.*is not a duration"),
        ({"unused_for": "-3d"}, "'unused_for'.*is not a duration"),
        ({"older_than": -5}, "'older_than' must be 0 or more"),
        ({"older_than": float("nan")}, "'older_than' must be 0 or more"),
        ({"min_age": [1]}, "'min_age' must be seconds or a duration"),
        ({"functions": [1, 2]}, "functions must be a list of patterns"),
        ({"keep": ["ok", ""]}, "keep has an empty pattern"),
        ({"corrupt": "yes"}, "'corrupt' must be true or false"),
        ({"orphans": 1}, "'orphans' must be true or false"),
    ],
)
def test_policy_from_mapping_rejects_bad_values(data, message):
    with pytest.raises(InvalidInputError, match=message):
        policy_from_mapping(data)


def test_policy_from_mapping_needs_a_mapping():
    with pytest.raises(InvalidInputError, match="must be a mapping"):
        policy_from_mapping(["unused_for", "14d"])  # type: ignore[arg-type]


def test_policy_checks_itself_when_built_directly():
    with pytest.raises(InvalidInputError, match="min_age_s must be 0 or more"):
        PrunePolicy(min_age_s=-1)
    with pytest.raises(InvalidInputError, match="max_total_bytes must be a whole number"):
        PrunePolicy(max_total_bytes="5GB")  # type: ignore[arg-type]
    assert PrunePolicy(functions=["a*", "b*"]).functions == ("a*", "b*")  # type: ignore[arg-type]
    assert hash(PrunePolicy(keep=["x"])) == hash(PrunePolicy(keep=("x",)))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------------
# Candidates from a real scan, and the executor on a real directory


ORPHAN_KEY = "jit_gone-" + "0" * 64


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


# --------------------------------------------------------------------------------------------------------------
# The CLI


def _break_two(root: Path) -> list[str]:
    names = sorted(p.name for p in root.iterdir() if p.name.endswith("-cache"))[:2]
    (root / names[0]).write_bytes(b"")
    (root / names[1]).write_bytes(b"\x01" * 300)
    return names


def test_cli_dry_run_changes_nothing(capsys, cache_copy):
    now = time.time()
    age_cache(cache_copy, created_ago=20 * DAY, used_ago=15 * DAY, now=now)
    broken = _break_two(cache_copy)
    for name in broken:
        os.utime(cache_copy / name, (now - 20 * DAY, now - 20 * DAY))
    (cache_copy / f"{ORPHAN_KEY}-atime").write_bytes(fmt.encode_atime(1))
    os.utime(cache_copy / f"{ORPHAN_KEY}-atime", (now - DAY, now - DAY))
    before = snapshot(cache_copy)
    stat_before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in cache_copy.iterdir()}
    code, out, err = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "14d", "--corrupt", "--orphans")
    assert code == 0 and err == ""
    assert out.splitlines()[0].split() == ["FUNCTION", "HASH", "SIZE", "LAST", "USED", "REASONS"]
    assert "corrupt: empty file" in out and "unused for 15d" in out and "orphaned -atime file" in out
    assert "would delete" in out and "add --apply to delete" in out
    assert snapshot(cache_copy) == before
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in cache_copy.iterdir()} == stat_before


def test_cli_apply_deletes_exactly_the_plan(capsys, cache_copy):
    now = time.time()
    keys_ = age_cache(cache_copy, created_ago=20 * DAY, used_ago=2 * DAY, now=now)
    stale = keys_[-3:]
    for key in stale:
        (cache_copy / f"{key}-atime").write_bytes(fmt.encode_atime(int((now - 30 * DAY) * 1e9)))
    broken = _break_two(cache_copy)
    assert not {n[:-6] for n in broken} & set(stale)
    for name in broken:
        os.utime(cache_copy / name, (now - 20 * DAY, now - 20 * DAY))
    (cache_copy / "README.txt").write_text("not JAX's")
    pinned = stale[0]
    before = snapshot(cache_copy)

    code, out, _ = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "14d", "--corrupt", "--keep", pinned,
                           "--json")
    dry = json.loads(out)
    assert code == 0 and dry["applied"] is False and dry["result"] is None
    planned = {d["key"] for d in dry["delete"]}
    assert planned == (set(stale) - {pinned}) | {n[:-6] for n in broken}
    assert [d["key"] for d in dry["protected"]] == [pinned] and dry["protected_by_reason"] == {
        f"pinned by {pinned!r}": 1,
    }
    assert set(dry["delete"][0]) == {
        "key", "function", "hash", "name", "size_bytes", "created_s", "last_used_s", "status", "orphan", "reasons",
    }
    assert snapshot(cache_copy) == before

    code, out, _ = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "14d", "--corrupt", "--keep", pinned,
                           "--apply", "--json")
    done = json.loads(out)
    assert code == 0 and done["applied"] is True
    assert done["result"] == {
        "deleted": len(planned), "bytes_freed": dry["bytes_freed"], "already_gone": 0, "changed": 0, "errors": [],
    }
    gone = {f"{k}-cache" for k in planned} | {f"{k}-atime" for k in planned}
    assert snapshot(cache_copy) == {k: v for k, v in before.items() if k not in gone}

    code, out, _ = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "14d", "--corrupt", "--keep", pinned,
                           "--apply")
    assert code == 0 and "deleted 0 entries, freed 0 B" in out


def test_cli_text_output_caps_the_table_and_summarises_protected(capsys, tmp_path, cache_copy):
    now = time.time()
    root = tmp_path / "many"
    build_synthetic(root, small_sources(cache_copy), 80, now)
    code, out, _ = run_cli(capsys, "prune", str(root), "--unused-for", "3d", "--keep", "jit_tiny*")
    lines = out.splitlines()
    plan_json = json.loads(run_cli(capsys, "prune", str(root), "--unused-for", "3d", "--keep", "jit_tiny*",
                                   "--json")[1])
    n = len(plan_json["delete"])
    assert code == 0 and n > 50
    assert f"... and {n - 50} more" in lines
    assert lines.index(f"... and {n - 50} more") == 51  # header + 50 rows
    protected = len(plan_json["protected"])
    assert protected and f"protected: {protected} selected entries kept" in out
    assert f"{protected}  pinned by 'jit_tiny*'" in out
    assert f"would delete {n} entries, freeing " in out and " remain)" in out


def test_cli_apply_verbose_prints_a_line_per_entry(capsys, cache_copy):
    now = time.time()
    age_cache(cache_copy, created_ago=20 * DAY, used_ago=20 * DAY, now=now)
    expected = sorted(p.name for p in cache_copy.iterdir() if p.name.startswith(("jit_tiny-", "jit_odd")))
    assert len(expected) == 4
    code, out, err = run_cli(capsys, "prune", str(cache_copy), "--function", "jit_tiny", "--function", "jit_odd*",
                             "--apply", "-v")
    assert code == 0
    assert sorted(err.splitlines()) == [f"removed {n}" for n in expected if n.endswith("-cache")]
    assert "deleted 2 entries, freed" in out
    assert not [p for p in cache_copy.iterdir() if p.name.startswith(("jit_tiny-", "jit_odd"))]


def test_cli_without_a_selecting_rule_exits_2(capsys, cache_copy):
    before = snapshot(cache_copy)
    for extra in ([], ["--keep", "x", "--min-age", "0s", "--apply"]):
        code, out, err = run_cli(capsys, "prune", str(cache_copy), *extra)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith("jaxcache: error: nothing selects entries: give --max-size")
    assert snapshot(cache_copy) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-size", "50XB"], "--max-size: '50XB' is not a size"),
        (["--max-size=-5GiB"], "--max-size: '-5GiB' is not a size"),
        (["--unused-for", "two weeks"], "--unused-for: 'two weeks' is not a duration"),
        (["--older-than", "3x"], "--older-than: '3x' is not a duration"),
        (["--corrupt", "--min-age", "soon"], "--min-age: 'soon' is not a duration"),
        (["--function", ""], "empty pattern"),
    ],
)
def test_cli_bad_values_exit_2_with_one_line(capsys, cache_copy, argv, message):
    code, out, err = run_cli(capsys, "prune", str(cache_copy), *argv, "--apply")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("jaxcache: error:") and message in err and "Traceback" not in err


def test_cli_bad_root_exits_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "prune", str(tmp_path / "missing"), "--older-than", "1d")
    assert code == 2 and "does not exist" in err


def test_cli_help_points_to_doctor(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["prune", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "jaxcache doctor" in out and "--apply" in out and "--max-size" in out


# --------------------------------------------------------------------------------------------------------------
# GCS (fake-gcs-server)


def _gcs_listing(client, bucket: str, prefix: str) -> dict[str, bytes]:
    base = prefix + "/"
    return {b.name[len(base):]: b.download_as_bytes() for b in client.list_blobs(bucket, prefix=base)}


def test_gcs_apply_deletes_exactly_the_plan(gcs_client, gcs_bucket, cache_copy):
    odd = [p.name[:-6] for p in sorted(cache_copy.iterdir()) if p.name.startswith(("jit_tiny-", "jit_odd"))
           and p.name.endswith("-cache")]
    pinned = next(p.name[:-6] for p in sorted(cache_copy.iterdir()) if p.name.startswith("jit__lambda-"))
    (cache_copy / f"{ORPHAN_KEY}-atime").write_bytes(fmt.encode_atime(1))
    upload_dir(gcs_client, gcs_bucket, "jax-cache", cache_copy)
    before = _gcs_listing(gcs_client, gcs_bucket, "jax-cache")
    storage = open_storage(f"gs://{gcs_bucket}/jax-cache")
    cands = [Candidate.from_record(r) for r in scan(storage)]
    assert all(c.generation for c in cands) and len(odd) == 2
    # Uploaded just now (GCS sets the time), so the grace period is turned off.
    policy = PrunePolicy(functions=("jit_tiny", "jit_odd*", "jit__lambda"), orphans=True, keep=(pinned,), min_age_s=0)
    p = plan(cands, policy, now=time.time())
    assert set(keys(p.delete)) == {*odd, ORPHAN_KEY} and keys(p.protected) == [pinned]
    result = apply(storage, p)
    assert (result.deleted, result.already_gone, result.changed, result.errors) == (3, 0, 0, [])
    gone = {f"{k}-cache" for k in odd} | {f"{k}-atime" for k in [*odd, ORPHAN_KEY]}
    assert _gcs_listing(gcs_client, gcs_bucket, "jax-cache") == {k: v for k, v in before.items() if k not in gone}
    again = apply(storage, p)
    assert (again.deleted, again.already_gone) == (0, 3)


def test_gcs_deletes_carry_the_generation_precondition(gcs_client, gcs_bucket, cache_copy):
    # Neither emulator enforces delete preconditions, so check the requests themselves.
    upload_dir(gcs_client, gcs_bucket, "c", cache_copy)
    storage = open_storage(f"gs://{gcs_bucket}/c")
    cands = [Candidate.from_record(r) for r in scan(storage)]
    one = cands[0]
    atime_gen = storage.stat(f"{one.key}-atime").generation
    cands[0] = Candidate(**{**{f: getattr(one, f) for f in one.__slots__}, "atime_generation": atime_gen})
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
    assert len(deletes) == 2 * len(cands)
    for c in cands:
        cache_req = [s for s in deletes if f"{c.key}-cache" in s]
        assert len(cache_req) == 1 and f"ifGenerationMatch={c.generation}" in cache_req[0]
        atime_req = [s for s in deletes if f"{c.key}-atime" in s]
        assert len(atime_req) == 1
        if c.atime_generation is None:
            assert "ifGenerationMatch" not in atime_req[0]
        else:
            assert f"ifGenerationMatch={atime_gen}" in atime_req[0]
    assert _gcs_listing(gcs_client, gcs_bucket, "c") == {".lockfile": b""}


# --------------------------------------------------------------------------------------------------------------
# Crash safety: SIGKILL half-way, then run again


def _pipe_write_blocked(pid: int, read_fd: int, capacity: int) -> bool:
    """True once the process sleeps in a write to the (full) pipe."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if "pipe_write" in wchan:
        return True
    if wchan in ("", "0"):  # the kernel hides wchan: a sleeping writer with a full pipe is blocked on it
        pending = bytearray(4)
        fcntl.ioctl(read_fd, termios.FIONREAD, pending)
        return state == "S" and int.from_bytes(pending, sys.byteorder) > capacity - 512
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and F_SETPIPE_SZ (Linux)")
def test_prune_killed_half_way_then_rerun_ends_like_one_clean_run(tmp_path, cache_copy):
    now = time.time()
    sources = small_sources(cache_copy)
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    build_synthetic(crashed, sources, 3000, now)
    (crashed / ".lockfile").write_bytes(b"")  # as JAX's LRU leaves it: deletions take JAX's lock
    shutil.copytree(crashed, clean)
    total = sum(p.stat().st_size for p in crashed.iterdir() if p.name.endswith("-cache"))
    args = ["--unused-for", "20d", "--max-size", str(int(total * 0.35)), "--keep", f"{sources[0][0]}*",
            "--min-age", "10m"]

    assert main(["prune", str(clean), *args, "--apply"]) == 0
    expected = snapshot(clean)
    planned = 3000 - sum(1 for n in expected if n.endswith("-cache"))
    assert 1000 < planned < 3000 and any(n.startswith(sources[0][0]) for n in expected)

    read_fd, write_fd = os.pipe()
    capacity = fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 16384)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jaxcache", "prune", str(crashed), *args, "--apply", "-v"],
            stdout=subprocess.DEVNULL, stderr=write_fd,
        )
        os.close(write_fd)
        write_fd = -1
        # Never read the pipe: the child blocks in a write once it is full (after a whole entry was removed).
        deadline = time.monotonic() + 300
        while not _pipe_write_blocked(proc.pid, read_fd, capacity):
            assert proc.poll() is None, f"prune finished (rc {proc.returncode}) without filling the pipe"
            assert time.monotonic() < deadline, "prune never blocked on its stderr pipe"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    left = sum(1 for p in crashed.iterdir() if p.name.endswith("-cache"))
    assert 3000 - planned < left < 3000, "the kill should land after some but not all deletions"
    atimes = sum(1 for p in crashed.iterdir() if p.name.endswith("-atime"))
    assert atimes == left  # killed between entries, never between an entry's two files

    assert main(["prune", str(crashed), *args, "--apply"]) == 0
    assert snapshot(crashed) == expected


# --------------------------------------------------------------------------------------------------------------
# Prune racing live JAX jobs


@pytest.mark.slow
@pytest.mark.parametrize("lru", [False, True], ids=["plain", "jax-lru"])
def test_prune_racing_live_jobs_never_breaks_them(tmp_path, lru):
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    logs = []
    procs = []
    for i in range(10):
        out = open(tmp_path / f"job{i}.out", "w+")  # noqa: SIM115 - closed below
        logs.append(out)
        cmd = [sys.executable, str(JOB), str(cache), "--rounds", "3", *(["--lru"] if lru else [])]
        procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
    storage = open_storage(str(cache))
    policy = PrunePolicy(older_than_s=0, min_age_s=0)
    deleted_while_running = passes = 0
    try:
        while any(p.poll() is None for p in procs):
            p = plan([Candidate.from_record(r) for r in scan(storage, read_headers=False)], policy, now=time.time())
            result = apply(storage, p)
            assert not result.errors
            deleted_while_running += result.deleted
            passes += 1
            time.sleep(0.05)  # leave the two cores to the jobs
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = []
    for f in logs:
        f.seek(0)
        outputs.append(f.read())
        f.close()
    assert codes == [0] * 10, "\n---\n".join(outputs)
    assert all(o.rstrip().endswith("ok") for o in outputs)
    if lru:
        # Deletions take JAX's own LRU lock, so its eviction never trips over a half-deleted entry.
        assert not any("persistent compilation cache" in o for o in outputs), "\n---\n".join(outputs)
    final = apply(storage, plan([Candidate.from_record(r) for r in scan(storage)], policy, now=time.time()))
    assert passes > 0 and deleted_while_running + final.deleted > 0
    assert not [n for n in os.listdir(cache) if n.endswith(("-cache", "-atime"))]
