"""Pydantic models at the API edge: what clients send and receive."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CacheSummary(BaseModel):
    name: str = Field(examples=["prod"])
    url: str = Field(examples=["gs://ml-jax-cache/prod"])
    entries: int
    size_bytes: int
    last_scan_s: float | None = Field(None, description="Unix time of the last completed scan")
    last_scan_seconds: float | None = None
    last_scan_error: str | None = None


class CacheList(BaseModel):
    caches: list[CacheSummary]


class EntryModel(BaseModel):
    key: str = Field(examples=["jit_train_step-74b295daef28036aaea5500f2ef5877805eddd3a0db96fb5a7850a99a0735906"])
    function: str = Field(examples=["jit_train_step"])
    size_bytes: int
    created_s: float
    last_used_s: float
    has_atime: bool
    compression: str | None = Field(None, examples=["zstd"])
    compile_seconds: int | None = Field(None, description="as JAX stores it: whole seconds, truncated")
    status: str | None = Field(None, examples=["ok"])
    reason: str | None = None
    generation: int | None = Field(None, description="GCS object generation")


class EntryPage(BaseModel):
    entries: list[EntryModel]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null on the last page")


class FunctionStatsModel(BaseModel):
    function: str
    entries: int
    size_bytes: int
    compile_seconds: int


class GrowthPoint(BaseModel):
    day: str = Field(examples=["2026-11-30"])
    entries: int
    size_bytes: int


class StatsModel(BaseModel):
    cache: str
    entries: int
    size_bytes: int
    compile_seconds: int
    corrupt: int
    orphans: int
    orphan_bytes: int
    compression: dict[str, int]
    mixed_compression: bool
    by_function: list[FunctionStatsModel] = Field(description="top 100 functions by size")
    functions_total: int
    growth: list[GrowthPoint] = Field(description="entries and bytes created per day, last 30 days")
    bytes_per_day: float = Field(description="mean bytes added per day over the last 7 days")


class PruneRequest(BaseModel):
    """A prune policy. Unknown fields are rejected: a typo must not silently widen a prune."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"max_total_bytes": "50GiB", "unused_for": "14d", "corrupt": True}]},
    )

    dry_run: bool = Field(True, description="only report what would be deleted (the default)")
    max_total_bytes: int | str | None = Field(None, description="evict least recently used until under this")
    unused_for: float | str | None = Field(None, description="seconds or a duration like 14d")
    older_than: float | str | None = Field(None, description="created longer ago than this")
    functions: list[str] = Field(default_factory=list, description="globs over function names")
    corrupt: bool = False
    orphans: bool = False
    keep: list[str] = Field(default_factory=list, description="keys or globs never to delete (besides pins)")
    min_age: float | str | None = Field(None, description="grace period, default 1h: younger entries stay")


class PlannedDeletion(BaseModel):
    key: str
    function: str
    size_bytes: int
    kind: Literal["entry", "orphan"]
    reasons: list[str]


class PruneResponse(BaseModel):
    dry_run: bool
    entries_total: int
    delete: list[PlannedDeletion]
    protected: list[PlannedDeletion] = Field(description="selected by a rule but kept; reasons say why")
    kept: int = Field(description="entries no rule selected")
    bytes_freed: int
    bytes_remaining: int
    deleted: int | None = Field(None, description="applied prunes: entries really deleted")
    already_gone: int | None = None
    changed: int | None = Field(None, description="replaced since listed (generation changed): left alone")
    errors: list[str] = Field(default_factory=list)
    audit_id: int | None = None


class PruneAudit(BaseModel):
    id: int
    at_s: float
    who: str
    policy: dict
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


class RescanModel(BaseModel):
    cache: str
    added: int
    removed: int
    updated: int
    entries: int
    seconds: float


class Health(BaseModel):
    status: str
    detail: dict[str, str] = Field(default_factory=dict)


class ErrorModel(BaseModel):
    detail: str
