"""Prunes and single-entry deletes: catalog candidates, core's plan, the executor's deletions; one per cache across
replicas (the ``prune:<cache>`` lock, else PruneInProgressError), audited before anything is deleted. What a prune
runs of other features (the rescan, integrity passes, the runs' jaxlibs) is handed in by app.py (:class:`Handed`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import delete, select

from jaxcache import entry as fmt
from jaxcache import prune as core_prune
from jaxcache import signing
from jaxcache.errors import InvalidInputError, JaxcacheError, PreconditionFailedError
from jaxcache.service import memory
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import FAILED, EntryRow, PinRow
from jaxcache.service.prune import audit as prune_audit
from jaxcache.service.prune.candidates import catalog_candidates
from jaxcache.service.state import State
from jaxcache.storage import Storage
from jaxcache.units import plural


@dataclasses.dataclass(frozen=True, slots=True)
class Handed:
    """What a prune runs of other features, handed in where the app is assembled (app.py): prune imports none."""

    rescan: Callable[[str], object]  # a cache's round (rounds.rescan_cache): the index as storage is now
    verify: Callable[[str, float], object]  # judge what needs it, throttled as the background pass (min_age_s)
    unjudged: Callable[[str], int]  # entries with no verdict for their version and the trusted keys yet
    recent_jaxlibs: Callable[[str, float], set[str]]  # jaxlibs of the runs updated since (warm-ups' too)
    changed: Callable[[str], None]  # an entry deleted: statistics and listings' ETags are stale
    keep: Callable[[str], None]  # compute a cache's statistics again and keep them, for every replica


class PruneInProgressError(Exception):
    """Another prune of the same cache is running (in this replica or another one)."""


class EntryNotDeletedError(JaxcacheError):
    """A single-entry delete could not remove the entry's file (the message says why); its catalog row stays."""


def _check_window(policy: core_prune.PrunePolicy, retain_s: float) -> None:
    """Refuse a stale_jaxlib window longer than run retention: compacted runs would make live entries look stale."""
    if policy.stale_jaxlib and policy.stale_jaxlib_window_s > retain_s:
        window, retain = (f"{s / 86400:g}" for s in (policy.stale_jaxlib_window_s, retain_s))
        raise InvalidInputError(
            f"stale_jaxlib_window {window}d is longer than the run records' retention (JAXCACHE_RECORDS_RETAIN_D="
            f"{retain}): runs older than that are compacted, so the jaxlib versions they used are not known; use a "
            f"window of at most {retain}d, or raise JAXCACHE_RECORDS_RETAIN_D")


def _plan(catalog: Catalog, cache: str, policy: core_prune.PrunePolicy, handed: Handed) -> core_prune.PrunePlan:
    now = time.time()
    recent = None
    if policy.stale_jaxlib:
        recent = handed.recent_jaxlibs(cache, now - policy.stale_jaxlib_window_s)
    with memory.gc_paused():
        candidates = catalog_candidates(catalog, cache, with_integrity=bool(policy.integrity))
        return core_prune.plan(candidates, policy, now=now, recent_jaxlibs=recent)


@dataclasses.dataclass(slots=True)
class Outcome:
    plan: core_prune.PrunePlan
    result: core_prune.PruneResult | None = None
    audit_id: int | None = None


def prune(state: State, cache: str, policy: core_prune.PrunePolicy, *, handed: Handed, policy_json: dict[str, Any],
          dry_run: bool, who: str) -> Outcome:
    """Plan a prune of one cache and, unless ``dry_run`` (the caller checked the scope), judge what ``integrity``
    needs, audit and apply it. Raises PruneInProgressError, and InvalidInputError for too long a stale_jaxlib window."""
    catalog, storage, settings = state.catalog, state.storages[cache], state.settings
    _check_window(policy, settings.records_retain_s)
    with catalog.session() as s:
        pins = tuple(s.scalars(select(PinRow.pattern).where(PinRow.cache == cache).order_by(PinRow.pattern)))
    policy = dataclasses.replace(policy, keep=policy.keep + pins)
    if dry_run:
        state.reach.check(cache)  # a root gone (unmounted) or not answering (within seconds) refuses: rows are not it
        plan = _plan(catalog, cache, policy, handed)
        if policy.integrity and (unjudged := handed.unjudged(cache)):
            are = "is" if unjudged == 1 else "are"
            plan.notes.append(f"integrity used the verdicts made so far: {plural(unjudged, 'entry')} {are} not judged"
                              " yet (the background pass will judge them; applying this prune judges them first)")
        return Outcome(plan)
    lock = state.prune_locks.get(cache)
    if not lock.acquire(blocking=False):
        raise PruneInProgressError(cache)
    try:
        # Storage is the truth: refresh the index first so the plan sees entries written since the last scan.
        handed.rescan(cache)
        prune_audit.close(catalog, cache, prune_audit.tally_interrupted(catalog, cache, storage))
        if policy.integrity:  # throttled as the background pass is
            handed.verify(cache, policy.min_age_s)
        plan = _plan(catalog, cache, policy, handed)
        audit_id = prune_audit.begin(catalog, cache, plan.delete, who=who, policy_json=policy_json)
        result = _apply_audited(catalog, audit_id, storage, plan)
        if policy.orphans:
            # Signatures whose entry is gone (JAX's own LRU deletes only -cache and -atime): not catalog rows.
            for name in signing.orphans(storage):
                storage.delete(name)
        handed.rescan(cache)
    finally:
        lock.release()
    state.metrics.prune_deleted.labels(cache).inc(result.deleted)
    state.metrics.prune_bytes.labels(cache).inc(result.bytes_freed)
    # No change of its own to announce: the rescan above found what the prune deleted, and moved the counts and kept
    # the statistics if it found anything.
    return Outcome(plan, result, audit_id)


def _apply_audited(catalog: Catalog, audit_id: int, storage: Storage,
                   plan: core_prune.PrunePlan) -> core_prune.PruneResult:
    """Apply ``plan`` under audit row ``audit_id``, which says how far it got; an undeleted entry marks it "failed"."""
    done = core_prune.PruneResult()

    def count(decision: core_prune.Decision) -> None:  # deleted now or already gone: either way not there any more
        done.deleted += 1
        done.bytes_freed += decision.candidate.size_bytes

    try:
        result = core_prune.apply(storage, plan, on_deleted=count)
    except Exception as exc:
        prune_audit.finish(catalog, audit_id, done, state=FAILED,
                           error=f"stopped after {done.deleted} of {plural(len(plan.delete), 'object')}: {exc}")
        raise
    if result.failed:
        prune_audit.finish(catalog, audit_id, result, state=FAILED,
                           error=f"{result.failed} of {len(plan.delete)} planned objects could not be deleted and "
                                 "are still there (each error below says why)")
    else:
        prune_audit.finish(catalog, audit_id, result)
    return result


def delete_entry(state: State, cache: str, key: str, *, handed: Handed, who: str) -> bool:
    """Delete one entry as a one-entry prune would, audited; False when neither storage nor catalog had it. Raises
    PruneInProgressError, and EntryNotDeletedError when its file is still there (its row stays). The statistics are
    the caller's to keep (``handed.keep``): a request answers first."""
    catalog, storage = state.catalog, state.storages[cache]
    lock = state.prune_locks.get(cache)
    if not lock.acquire(blocking=False):
        raise PruneInProgressError(cache)
    try:
        with catalog.session() as s:
            row = s.get(EntryRow, (cache, key, "entry"))
            stat = storage.stat(fmt.cache_name(key))
            if row is None and stat is None:
                return False
            candidate = core_prune.Candidate(
                key=key, module=key.rsplit("-", 1)[0], name=fmt.cache_name(key),
                size_bytes=stat.size_bytes if stat else row.size_bytes if row else 0,
                created_s=row.created_s if row else 0.0, last_used_s=row.seen_used_s if row else 0.0,
                status=row.status if row else None, version=row.version if row else None, has_atime=True)
        plan = core_prune.PrunePlan(delete=[core_prune.Decision(candidate, ("deleted by request",))], protected=[],
                                    kept=0, bytes_freed=candidate.size_bytes, bytes_remaining=0, entries_total=1)
        audit_id = prune_audit.begin(catalog, cache, plan.delete, who=who, policy_json={"key": key}, kind="delete")
        result = _apply_audited(catalog, audit_id, storage, plan)
        if result.changed:
            raise PreconditionFailedError(f"{key} was written again since it was listed: rescan and try again")
        if result.failed:
            raise EntryNotDeletedError(f"{key!r} was not deleted: {'; '.join(result.errors)}")
        with catalog.session() as s:
            s.execute(delete(EntryRow).where(EntryRow.cache == cache, EntryRow.key == key))
    finally:
        lock.release()
    handed.changed(cache)
    return True

