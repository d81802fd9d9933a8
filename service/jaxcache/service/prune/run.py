"""Prunes and deletions of a cache's entries, audited, one at a time per cache across replicas."""

from __future__ import annotations

from typing import Any

from jaxcache.prune import PrunePolicy
from jaxcache.service.prune import audit as prune_audit
from jaxcache.service.prune import pruning as prune_pass
from jaxcache.service.state import State


def prune(state: State, name: str, policy: PrunePolicy, *, policy_json: dict[str, Any], dry_run: bool,
          who: str) -> prune_pass.Outcome:
    """Plan (or apply, unless ``dry_run``: the caller checked the admin scope) a prune of ``name``. Raises
    PruneInProgressError while another prune of ``name`` runs."""
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
    """Close the audit rows of prunes of ``name`` whose replica died mid-way (none runs while we hold the cache's
    prune lock; skipped while one does)."""
    if not prune_audit.any_running(state.catalog, name):
        # The usual case, after every rescan: the lock is not taken, so a prune asked meanwhile (as soon as the
        # first scan makes the replica ready) is not refused.
        return
    lock = state.prune_locks.get(name)
    if not lock.acquire(blocking=False):
        return
    try:
        interrupted = prune_audit.tally_interrupted(state.catalog, name, state.storages[name])
    finally:
        lock.release()
    # Closed once the lock is free, and refreshed after: whoever reads the audit closed may prune at once, and must
    # not be told that a prune is still running. A prune that starts in between closes these rows itself first.
    closed = prune_audit.close(state.catalog, name, interrupted)
    if closed:
        state.changed(name)
