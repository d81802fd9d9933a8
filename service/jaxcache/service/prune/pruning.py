"""Prunes through the service: catalog candidates, core's plan, the executor's deletions; one per cache across
replicas (the ``prune:<cache>`` lock, else 409), audited before it deletes."""

from __future__ import annotations

import dataclasses
import time

from sqlalchemy import delete, select

from jaxcache import entry as fmt
from jaxcache import prune, signing
from jaxcache.errors import InvalidInputError, JaxcacheError, PreconditionFailedError
from jaxcache.service import memory
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.locks import ClusterLock, ClusterLocks
from jaxcache.service.catalog.models import EntryRow, PinRow
from jaxcache.service.integrity import verification
from jaxcache.service.prune import audit as prune_audit
from jaxcache.service.prune.candidates import catalog_candidates
from jaxcache.service.reports import usage_queries
from jaxcache.service.rescan.scan import rescan
from jaxcache.signing import TrustedKeys
from jaxcache.storage import Storage
from jaxcache.units import plural


class PruneInProgressError(Exception):
    """Another prune of the same cache is running (in this replica or another one)."""


class EntryNotDeletedError(JaxcacheError):
    """A single-entry delete could not remove the entry's file (the message says why); its catalog row stays."""


class PruneLocks:
    """The prune lock of each cache, shared by every replica on the catalog."""

    def __init__(self, locks: ClusterLocks) -> None:
        self._locks = locks

    def get(self, cache: str) -> ClusterLock:
        return self._locks.get(f"prune:{cache}")


def _check_window(policy: prune.PrunePolicy, retain_s: float | None) -> None:
    """Refuse a stale_jaxlib window longer than run retention: compacted runs would make live entries look stale."""
    if policy.stale_jaxlib and retain_s is not None and policy.stale_jaxlib_window_s > retain_s:
        raise InvalidInputError(
            f"stale_jaxlib_window {_days(policy.stale_jaxlib_window_s)}d is longer than the run records' retention "
            f"(JAXCACHE_RECORDS_RETAIN_D={_days(retain_s)}): runs older than that are compacted, so the jaxlib "
            f"versions they used are not known; use a window of at most {_days(retain_s)}d, or raise "
            "JAXCACHE_RECORDS_RETAIN_D")


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g}"


def _plan(catalog: Catalog, cache: str, policy: prune.PrunePolicy, retain_s: float | None = None) -> prune.PrunePlan:
    _check_window(policy, retain_s)
    now = time.time()
    recent = None
    if policy.stale_jaxlib:
        with catalog.reader() as conn:
            recent = usage_queries.recent_jaxlibs(conn, cache, since=now - policy.stale_jaxlib_window_s)
    with memory.gc_paused():
        candidates = catalog_candidates(catalog, cache, with_integrity=bool(policy.integrity))
        return prune.plan(candidates, policy, now=now, recent_jaxlibs=recent)


def pins(catalog: Catalog, cache: str) -> tuple[str, ...]:
    with catalog.session() as s:
        return tuple(s.scalars(select(PinRow.pattern).where(PinRow.cache == cache).order_by(PinRow.pattern)))


@dataclasses.dataclass(slots=True)
class Outcome:
    plan: prune.PrunePlan
    result: prune.PruneResult | None = None
    audit_id: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Throttle:
    """How fast an integrity pass run for a prune may read: as the background pass does."""

    bytes_per_s: float | None = None
    cpu_share: float | None = None


def run_prune(
    catalog: Catalog, cache: str, storage: Storage, policy: prune.PrunePolicy, *, dry_run: bool, who: str,
    policy_json: dict, lock: ClusterLock, throttle: Throttle | None = None,
    retain_s: float | None = None, trusted: TrustedKeys | None = None,
) -> Outcome:
    """Plan a prune of one cache and, unless ``dry_run``, judge what ``integrity`` needs, audit and apply it.
    Raises PruneInProgressError, and InvalidInputError for a stale_jaxlib window beyond ``retain_s``."""
    _check_window(policy, retain_s)
    policy = dataclasses.replace(policy, keep=policy.keep + pins(catalog, cache))
    if dry_run:
        storage.ping()  # a root that is gone (unmounted) refuses: its rows are not what is there
        plan = _plan(catalog, cache, policy, retain_s)
        if policy.integrity:
            unjudged = verification.unjudged(catalog, cache, TrustedKeys.from_env() if trusted is None else trusted)
            if unjudged:
                are = "is" if unjudged == 1 else "are"
                plan.notes.append(f"integrity used the verdicts made so far: {plural(unjudged, 'entry')} {are} not"
                                  " judged yet (the background pass will judge them; applying this prune judges them"
                                  " first)")
        return Outcome(plan)
    if not lock.acquire(blocking=False):
        raise PruneInProgressError(cache)
    try:
        # Storage is the truth: refresh the index first so the plan sees entries written since the last scan.
        rescan(catalog, cache, storage)
        prune_audit.close(catalog, cache, prune_audit.tally_interrupted(catalog, cache, storage))
        if policy.integrity:
            throttle = throttle or Throttle()
            verification.run_pass(catalog, cache, storage, min_age_s=policy.min_age_s,
                                  bytes_per_s=throttle.bytes_per_s, cpu_share=throttle.cpu_share, trusted=trusted)
        plan = _plan(catalog, cache, policy, retain_s)
        audit_id = prune_audit.begin(catalog, cache, plan.delete, who=who, policy_json=policy_json)
        result = _apply_audited(catalog, audit_id, storage, plan)
        if policy.orphans:
            # Signatures whose entry is gone (JAX's own LRU deletes only -cache and -atime): not catalog rows.
            for name in signing.orphans(storage):
                storage.delete(name)
        rescan(catalog, cache, storage)
        return Outcome(plan, result, audit_id)
    finally:
        lock.release()


def _apply_audited(catalog: Catalog, audit_id: int, storage: Storage, plan: prune.PrunePlan) -> prune.PruneResult:
    """Apply ``plan`` under audit row ``audit_id``, which says how far it got; an undeleted entry marks it "failed"."""
    done = prune.PruneResult()

    def count(decision: prune.Decision) -> None:  # deleted now or already gone: either way not there any more
        done.deleted += 1
        done.bytes_freed += decision.candidate.size_bytes

    try:
        result = prune.apply(storage, plan, on_deleted=count)
    except Exception as exc:
        prune_audit.finish(catalog, audit_id, done, state=prune_audit.FAILED,
                           error=f"stopped after {done.deleted} of {plural(len(plan.delete), 'object')}: {exc}")
        raise
    if result.failed:
        prune_audit.finish(catalog, audit_id, result, state=prune_audit.FAILED,
                           error=f"{result.failed} of {len(plan.delete)} planned objects could not be deleted and "
                                 "are still there (each error below says why)")
    else:
        prune_audit.finish(catalog, audit_id, result)
    return result


def delete_entry(catalog: Catalog, cache: str, storage: Storage, key: str, *, who: str, lock: ClusterLock) -> bool:
    """Delete one entry as a one-entry prune would, audited; False when neither storage nor catalog had it. Raises
    PruneInProgressError, and EntryNotDeletedError when its file is still there (its row stays)."""
    if not lock.acquire(blocking=False):
        raise PruneInProgressError(cache)
    try:
        with catalog.session() as s:
            row = s.get(EntryRow, (cache, key, "entry"))
            stat = storage.stat(fmt.cache_name(key))
            if row is None and stat is None:
                return False
            candidate = prune.Candidate(
                key=key, module=key.rsplit("-", 1)[0], name=fmt.cache_name(key),
                size_bytes=stat.size_bytes if stat else row.size_bytes if row else 0,
                created_s=row.created_s if row else 0.0, last_used_s=row.seen_used_s if row else 0.0,
                status=row.status if row else None, generation=row.generation if row else None, has_atime=True)
        plan = prune.PrunePlan(delete=[prune.Decision(candidate, ("deleted by request",))], protected=[], kept=0,
                               bytes_freed=candidate.size_bytes, bytes_remaining=0, entries_total=1)
        audit_id = prune_audit.begin(catalog, cache, plan.delete, who=who, policy_json={"key": key}, kind="delete")
        result = _apply_audited(catalog, audit_id, storage, plan)
        if result.changed:
            raise PreconditionFailedError(f"{key} was written again since it was listed: rescan and try again")
        if result.failed:
            raise EntryNotDeletedError(f"{key!r} was not deleted: {'; '.join(result.errors)}")
        with catalog.session() as s:
            s.execute(delete(EntryRow).where(EntryRow.cache == cache, EntryRow.key == key))
        return True
    finally:
        lock.release()
