"""Prune policies, plans and results, the audit log and pins."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from jaxcache import prune
from jaxcache.errors import InvalidInputError
from jaxcache.service import memory
from jaxcache.service.prune.run import Outcome
from jaxcache.service.web.fields import Duration, Glob, Size

#: The core's cross-field rules, stated for clients: a policy selects something; stale_jaxlib_window needs stale_jaxlib.
_SELECTS_SOMETHING: list[Any] = [
    *({"required": [f], "properties": {f: {"not": {"type": "null"}}}}
      for f in ("max_total_bytes", "unused_for", "older_than")),
    *({"required": [f], "properties": {f: {"minItems": 1}}} for f in ("functions", "integrity")),
    *({"required": [f], "properties": {f: {"const": True}}} for f in ("corrupt", "orphans", "stale_jaxlib")),
]
_WINDOW_NEEDS_RULE: dict[str, Any] = {
    "if": {"required": ["stale_jaxlib_window"], "properties": {"stale_jaxlib_window": {"not": {"type": "null"}}}},
    "then": {"required": ["stale_jaxlib"], "properties": {"stale_jaxlib": {"const": True}}},
}
#: A plan over a million entries can select half of them: listing each costs more than planning.
DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 1_000_000


class PruneRequest(BaseModel):
    """A prune policy. Unknown fields are rejected: a typo must not silently widen a prune."""

    # Strict: `"stale_jaxlib": 0` is a client's mistake, not a false.
    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{"max_total_bytes": "50GiB", "unused_for": "14d", "corrupt": True}],
                           "anyOf": _SELECTS_SOMETHING, **_WINDOW_NEEDS_RULE},
    )

    dry_run: bool = Field(True, description="only report what would be deleted (the default)")
    max_total_bytes: Size = Field(None, description="evict least recently used until under this")
    unused_for: Duration = Field(None, description="a duration with its unit, like 14d (a number only when 0)")
    older_than: Duration = Field(None, description="created longer ago than this")
    functions: list[Glob] = Field(default_factory=list, description="globs over function names")
    corrupt: bool = False
    orphans: bool = False
    keep: list[Glob] = Field(default_factory=list, description="keys or globs never to delete (besides pins)")
    min_age: Duration = Field(None, description="grace period, default 1h: younger entries stay")
    stale_jaxlib: bool = Field(False, description="entries whose first writer's jaxlib no run used within "
                                                  "stale_jaxlib_window (they can never hit again)")
    stale_jaxlib_window: Duration = Field(None, description="default 14d; only with stale_jaxlib")
    # Not strict: JSON Schema's integer includes 2.0 (a client's float-typed number); _whole refuses the rest.
    list_limit: int = Field(
        DEFAULT_LIST_LIMIT, ge=0, le=MAX_LIST_LIMIT, strict=False,
        description="list at most this many planned deletions, and as many protected entries, first to go first; "
                    "the counts and bytes always cover the whole plan")
    integrity: list[Literal["tampered", "mismatched", "differs", "corrupt"]] = Field(
        default_factory=list, description="entries whose integrity verdict is one of these (applying judges entries "
                                          "not judged yet first, throttled; a dry run uses the verdicts made so far)")

    @field_validator("list_limit", mode="before")
    @classmethod
    def _whole(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("list_limit must be a whole number")
        return value


class PlannedDeletion(BaseModel):
    key: str
    function: str
    size_bytes: int
    kind: Literal["entry", "orphan"]
    reasons: list[str]


class PruneResponse(BaseModel):
    dry_run: bool
    entries_total: int
    delete: list[PlannedDeletion] = Field(description="what goes, first to go first: at most the request's "
                                                      "list_limit of them (delete_count is all)")
    delete_count: int = Field(description="entries and orphans the plan deletes, listed or not")
    protected: list[PlannedDeletion] = Field(description="selected by a rule but kept; reasons say why (at most "
                                                         "list_limit; protected_count is all)")
    protected_count: int
    truncated: bool = Field(description="true when delete or protected lists fewer than the plan holds")
    kept: int = Field(description="entries no rule selected")
    bytes_freed: int
    bytes_remaining: int
    deleted: int | None = Field(None, description="applied prunes: entries really deleted")
    already_gone: int | None = None
    changed: int | None = Field(None, description="replaced since listed (its version changed): left alone")
    failed: int | None = Field(None, description="applied prunes: entries that could not be deleted and are still "
                                                 "there (errors say why; the audit row says failed)")
    errors: list[str] = Field(default_factory=list)
    audit_id: int | None = None
    notes: list[str] = Field(default_factory=list, description="rules that could not select, and why")


class PruneAudit(BaseModel):
    """An applied prune or single-entry delete, audited before it deleted anything."""

    id: int
    at_s: float
    who: str
    policy: dict
    kind: Literal["prune", "delete"] = "prune"
    state: Literal["running", "done", "failed", "interrupted"] = Field(
        "done", description="running until it ends; interrupted: its replica stopped mid-way (closed at restart)")
    planned: int = Field(0, description="objects it planned to delete (written before the first delete)")
    planned_bytes: int = 0
    ended_s: float | None = None
    deleted: int
    bytes_freed: int
    already_gone: int
    changed: int
    errors: list[str]


class PruneAuditList(BaseModel):
    prunes: list[PruneAudit]


class PinModel(BaseModel):
    pattern: str
    created_s: float
    created_by: str


class PinList(BaseModel):
    pins: list[PinModel]


def policy_of(body: PruneRequest) -> tuple[prune.PrunePolicy, dict[str, Any]]:
    """The request's policy and its audit-log fields; InvalidInputError, also when it selects nothing."""
    data = body.model_dump(exclude={"dry_run", "list_limit"}, exclude_none=True)
    # Drop unset flags and empty lists, but keep zeros: `min_age: 0` and `max_total_bytes: 0` mean something.
    data = {k: v for k, v in data.items() if v is not False and v != []}
    policy = prune.policy_from_mapping(data)
    if not policy.selects_anything():
        raise InvalidInputError("the policy selects nothing: set max_total_bytes, unused_for, older_than, "
                                "functions, corrupt, orphans, stale_jaxlib or integrity")
    return policy, data


def _planned(decisions: Sequence[prune.Decision]) -> list[PlannedDeletion]:
    return [PlannedDeletion(key=d.candidate.key, function=d.candidate.module, size_bytes=d.candidate.size_bytes,
                            kind="orphan" if d.candidate.orphan else "entry", reasons=list(d.reasons))
            for d in decisions]


def _counts(outcome: Outcome, *, dry_run: bool, limit: int) -> PruneResponse:
    """The answer without its two lists: counts, bytes, the result of an applied prune, notes."""
    plan, result = outcome.plan, outcome.result
    applied: dict[str, Any] = {} if result is None else dict(
        deleted=result.deleted, already_gone=result.already_gone, changed=result.changed, failed=result.failed,
        errors=result.errors)
    return PruneResponse(
        dry_run=dry_run, entries_total=plan.entries_total, delete=[], delete_count=len(plan.delete), protected=[],
        protected_count=len(plan.protected), truncated=max(len(plan.delete), len(plan.protected)) > limit,
        kept=plan.kept, bytes_freed=plan.bytes_freed, bytes_remaining=plan.bytes_remaining,
        audit_id=outcome.audit_id, notes=plan.notes, **applied)


def response_of(outcome: Outcome, *, dry_run: bool, limit: int = DEFAULT_LIST_LIMIT) -> PruneResponse:
    """The answer to a planned or applied prune, listing at most ``limit`` deletions and as many protected."""
    answer = _counts(outcome, dry_run=dry_run, limit=limit)
    answer.delete, answer.protected = _planned(outcome.plan.delete[:limit]), _planned(outcome.plan.protected[:limit])
    return answer


#: Listed deletions are made and encoded this many at a time.
ENCODED_AT_ONCE = 1000
_LISTED = TypeAdapter(list[PlannedDeletion])


def encoded_response(outcome: Outcome, *, dry_run: bool, limit: int = DEFAULT_LIST_LIMIT) -> Iterator[bytes]:
    """:func:`response_of`'s JSON in parts (counts, then lists :data:`ENCODED_AT_ONCE` at a time), collector paused."""
    counts = _counts(outcome, dry_run=dry_run, limit=limit).model_dump_json(exclude={"delete", "protected"})
    yield counts[:-1].encode()
    for field, decisions in (("delete", outcome.plan.delete), ("protected", outcome.plan.protected)):
        yield f',"{field}":['.encode()
        shown = min(limit, len(decisions))
        for start in range(0, shown, ENCODED_AT_ONCE):
            with memory.gc_paused():  # the models of a part, while the plan's columns are alive: memory.py
                part = listed_json(decisions, start, min(start + ENCODED_AT_ONCE, shown))
            yield part if start == 0 else b"," + part
        yield b"]"
    yield b"}"


def listed_json(decisions: Sequence[prune.Decision], start: int, stop: int) -> bytes:
    """Decisions ``start`` to ``stop`` as JSON array items, without the brackets."""
    return _LISTED.dump_json(_planned(decisions[start:stop]))[1:-1]
