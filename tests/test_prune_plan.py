"""The planner and the policy: candidates in, a plan out (pure), and policies from user input."""

from __future__ import annotations

import pytest

from jaxcache.errors import InvalidInputError
from jaxcache.prune import (
    PrunePolicy,
    plan,
    policy_from_mapping,
)
from prune_support import (
    DAY,
    HOUR,
    NOW,
    cand,
    keys,
)

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
        "max_total_bytes": "50GiB", "unused_for": "14d", "older_than": "1d", "functions": ["jit_old*"],
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
        ({"unused_for": "-3d"}, "'unused_for'.*'-3d' is negative: a duration is 0 or more"),
        ({"older_than": -5}, "'older_than' must be 0 or more"),
        ({"older_than": float("nan")}, "'older_than' must be 0 or more"),
        ({"min_age": [1]}, "'min_age' must be a duration like '14d'"),
        # A number reads as days as well as seconds (policies.json's "unused_for": 14): only 0 goes without a unit.
        ({"unused_for": 14}, "'unused_for': '14' has no unit: write 14d for days or 14s for seconds"),
        ({"older_than": 86400.0}, "'older_than': '86400' has no unit: write 86400d for days or 86400s for seconds"),
        ({"stale_jaxlib": True, "stale_jaxlib_window": "7"}, "'stale_jaxlib_window': '7' has no unit"),
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
