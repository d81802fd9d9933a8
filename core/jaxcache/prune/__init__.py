"""Prune a cache root: a policy (:mod:`.policy`), a pure planner (:mod:`.planner`: candidates in, plan out) and an
executor (:mod:`.executor`) that deletes a plan. Deleting entries under running jobs is safe for them: JAX turns a
missing or unreadable entry into a recompile (docs/jax-internals.md)."""

from __future__ import annotations

from jaxcache.prune.candidates import Candidate, CandidateColumns, Decision, Decisions
from jaxcache.prune.executor import PruneResult, apply
from jaxcache.prune.planner import CORRUPT_REASON, ORPHAN_REASON, OVER_MAX_TOTAL, PrunePlan, plan
from jaxcache.prune.policy import INTEGRITY_CLASSES, STALE_JAXLIB_WINDOW_S, PrunePolicy, policy_from_mapping

__all__ = [
    "CORRUPT_REASON", "INTEGRITY_CLASSES", "ORPHAN_REASON", "OVER_MAX_TOTAL", "STALE_JAXLIB_WINDOW_S", "Candidate",
    "CandidateColumns", "Decision", "Decisions", "PrunePlan", "PrunePolicy", "PruneResult", "apply", "plan",
    "policy_from_mapping",
]
