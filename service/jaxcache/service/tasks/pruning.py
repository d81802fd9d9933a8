"""Prunes through the service: the catalog supplies candidates, core policy plans, the executor deletes.

One prune per cache at a time, across every replica sharing the catalog (the ``prune:<cache>`` lock of
:mod:`jaxcache.service.catalog.locks`; a second gets 409); every applied prune is written to the audit log.
"""

from __future__ import annotations

import dataclasses
import time

from sqlalchemy import select

from jaxcache import prune
from jaxcache.service.catalog import queries
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.locks import ClusterLock, ClusterLocks
from jaxcache.service.catalog.models import EntryRow, PinRow, PruneRow
from jaxcache.service.catalog.queries import verdicts as verdicts_q
from jaxcache.service.tasks import verification
from jaxcache.service.tasks.rescan import rescan
from jaxcache.storage import Storage


class PruneInProgressError(Exception):
    """Another prune of the same cache is running (in this replica or another one)."""


class PruneLocks:
    """The prune lock of each cache, shared by every replica on the catalog."""

    def __init__(self, locks: ClusterLocks) -> None:
        self._locks = locks

    def get(self, cache: str) -> ClusterLock:
        return self._locks.get(f"prune:{cache}")


def _candidates(catalog: Catalog, cache: str, *, with_integrity: bool = False) -> list[prune.Candidate]:
    verdicts: dict[str, str] = {}
    if with_integrity:
        with catalog.reader() as conn:
            verdicts = verdicts_q.classes_of(conn, cache)
    with catalog.session() as s:
        rows = s.execute(
            select(EntryRow.key, EntryRow.module, EntryRow.name, EntryRow.size_bytes, EntryRow.created_s,
                   EntryRow.seen_used_s, EntryRow.status, EntryRow.kind, EntryRow.generation, EntryRow.has_atime,
                   EntryRow.last_hit_s, EntryRow.writer_jaxlib)
            .where(EntryRow.cache == cache)
        ).all()
    return [
        prune.Candidate(
            key=r.key, module=r.module, name=r.name, size_bytes=r.size_bytes, created_s=r.created_s,
            last_used_s=r.seen_used_s, status=r.status, orphan=r.kind == "orphan", generation=r.generation,
            has_atime=bool(r.has_atime), last_hit_s=r.last_hit_s, writer_jaxlib=r.writer_jaxlib,
            integrity=verdicts.get(r.key),
        )
        for r in rows
    ]


def _plan(catalog: Catalog, cache: str, policy: prune.PrunePolicy) -> prune.PrunePlan:
    now = time.time()
    recent = None
    if policy.stale_jaxlib:
        with catalog.reader() as conn:
            recent = queries.recent_jaxlibs(conn, cache, since=now - policy.stale_jaxlib_window_s)
    candidates = _candidates(catalog, cache, with_integrity=bool(policy.integrity))
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
    policy_json: dict, lock: ClusterLock, secret: bytes | None = None, throttle: Throttle | None = None,
) -> Outcome:
    """Plan (and unless ``dry_run``, apply and audit) a prune of one cache. Raises PruneInProgressError.

    A dry run reads nothing from storage: with ``integrity`` it uses the verdicts already made and says how many
    entries are not judged yet (anyone with a read token may ask for one). Applying (an admin) first judges those
    entries, throttled like the background pass."""
    policy = dataclasses.replace(policy, keep=policy.keep + pins(catalog, cache))
    if dry_run:
        plan = _plan(catalog, cache, policy)
        if policy.integrity:
            unjudged = verification.unjudged(catalog, cache)
            if unjudged:
                plan.notes.append(f"integrity used the verdicts made so far: {unjudged} entries are not judged yet"
                                  " (the background pass will judge them; applying this prune judges them first)")
        return Outcome(plan)
    if not lock.acquire(blocking=False):
        raise PruneInProgressError(cache)
    try:
        # Storage is the truth: refresh the index first so the plan sees entries written since the last scan.
        rescan(catalog, cache, storage, secret=secret)
        if policy.integrity:
            throttle = throttle or Throttle()
            verification.run_pass(catalog, cache, storage, min_age_s=policy.min_age_s,
                                  bytes_per_s=throttle.bytes_per_s, cpu_share=throttle.cpu_share)
        plan = _plan(catalog, cache, policy)
        result = prune.apply(storage, plan)
        rescan(catalog, cache, storage, secret=secret)
        with catalog.session() as s:
            row = PruneRow(
                cache=cache, at_s=time.time(), who=who, policy=policy_json, deleted=result.deleted,
                bytes_freed=result.bytes_freed, already_gone=result.already_gone, changed=result.changed,
                errors=result.errors[:100],
            )
            s.add(row)
            s.flush()
            audit_id = row.id
        return Outcome(plan, result, audit_id)
    finally:
        lock.release()
