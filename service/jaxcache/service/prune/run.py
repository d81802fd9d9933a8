"""Prunes and deletions of a cache's entries, audited, one at a time per cache across replicas."""

from __future__ import annotations

from typing import Any

from jaxcache.prune import PrunePolicy
from jaxcache.service.prune import audit as prune_audit
from jaxcache.service.prune import pruning as prune_pass
from jaxcache.service.state import State


def prune(state: State, name: str, policy: PrunePolicy, *, policy_json: dict[str, Any], dry_run: bool,
          who: str) -> prune_pass.Outcome:
    """Plan, or unless ``dry_run`` apply (the caller checked the scope), a prune of ``name``; PruneInProgressError."""
    throttle = prune_pass.Throttle(state.settings.verify_bytes_per_s, state.settings.verify_cpu_share)
    outcome = prune_pass.run_prune(state.catalog, name, state.storages[name], policy, dry_run=dry_run, who=who,
                                   policy_json=policy_json, lock=state.prune_locks.get(name),
                                   throttle=throttle, trusted=state.settings.trusted,
                                   retain_s=state.settings.records_retain_s)
    if outcome.result is not None:
        state.metrics.prune_deleted.labels(name).inc(outcome.result.deleted)
        state.metrics.prune_bytes.labels(name).inc(outcome.result.bytes_freed)
        state.changed(name)
    return outcome


def delete_entry(state: State, name: str, key: str, *, who: str) -> bool:
    """Delete one entry, audited; False when there was none. Raises PruneInProgressError."""
    deleted = prune_pass.delete_entry(state.catalog, name, state.storages[name], key, who=who,
                                      lock=state.prune_locks.get(name))
    if deleted:
        state.changed(name)
    return deleted


def close_interrupted_prunes(state: State, name: str) -> None:
    """Close the audit rows of prunes of ``name`` whose replica died mid-way, unless a prune holds the lock."""
    if not prune_audit.any_running(state.catalog, name):
        # Not waiting for the lock, so a prune asked as soon as the replica is ready is not refused.
        return
    lock = state.prune_locks.get(name)
    if not lock.acquire(blocking=False):
        return
    try:
        interrupted = prune_audit.tally_interrupted(state.catalog, name, state.storages[name])
    finally:
        lock.release()
    # Refreshed after closing, so a reader of the closed audit may prune at once (a prune between closes them first).
    closed = prune_audit.close(state.catalog, name, interrupted)
    if closed:
        state.changed(name)
