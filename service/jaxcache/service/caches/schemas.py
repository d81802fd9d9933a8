"""The caches and their statistics, as the API answers them."""

from __future__ import annotations

from pydantic import BaseModel, Field

from jaxcache.service.reports.schemas import MissesByCause

#: Skipped names kept for a cache's status (the count is whole); ``jaxcache doctor`` lists them all.
SKIPPED_SHOWN = 20


class SkippedObject(BaseModel):
    name: str = Field(description="the object's name under the root, with control, bidirectional and other "
                                  "invisible characters escaped (\\u202e) and a backslash doubled",
                      examples=["jit_a\\\\b-0f3a...-cache"])
    why: str = Field(examples=["a FIFO, not a regular file"])


class CacheSummary(BaseModel):
    name: str = Field(examples=["prod"])
    url: str = Field(examples=["gs://ml-jax-cache/prod"])
    entries: int
    size_bytes: int
    last_scan_s: float | None = Field(None, description="Unix time of the last completed scan")
    last_scan_seconds: float | None = None
    last_scan_error: str | None = None
    reports_waiting: int = Field(0, description="run records accepted and not folded into the catalog yet (the drain "
                                                "folds them within seconds)")
    last_scan_skipped: int | None = Field(
        None, description="objects named like entries, -atime files or records that the last completed scan did not "
                          "read: not regular files (FIFOs, sockets, links, folders) or names the storage cannot map "
                          "(a backslash); null before the first scan. `jaxcache doctor` lists them all")
    last_scan_skipped_names: list[SkippedObject] = Field(
        default_factory=list, description=f"the first {SKIPPED_SHOWN} of them by name, escaped for display, with why "
                                          "each was skipped")


class CacheList(BaseModel):
    caches: list[CacheSummary]


class FunctionStatsModel(BaseModel):
    function: str
    entries: int
    size_bytes: int
    compile_seconds: int


class FunctionSavedModel(BaseModel):
    function: str
    entries: int = Field(description="entries of the function that saved time")
    hits: int
    saved_s: float = Field(description="compile seconds their reported hits saved")


class GrowthPoint(BaseModel):
    day: str = Field(examples=["2026-11-30"])
    entries: int
    size_bytes: int


class UsageWindowModel(BaseModel):
    since_s: float = Field(description="start of the window (Unix time)")
    jobs: int
    runs: int
    processes: int
    hits: int
    misses: int = Field(description="programs compiled because the cache did not have them")
    hit_rate: float | None = Field(None, description="hits / (hits + misses); null without lookups",
                                   examples=[0.97])
    saved_s: float = Field(description="compile seconds saved by hits")


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
    bytes_per_day: float | None = Field(description=(
        "mean bytes added per day over the last 7 days, or over the days the cache has existed when it is younger"
        " (from its oldest entry's creation); null before it is a day old"))
    first_created_s: float | None = Field(None, description="creation time of the cache's oldest entry (null: none)")
    computed_s: float = Field(description="when the figures above were computed (Unix time): once after each change "
                                          "of the cache's entries, by the process that made it, for every replica")
    last_24h: UsageWindowModel = Field(
        description="jobs' processes whose run records were updated in the last 24 h (warm-ups are not jobs)")
    last_7d: UsageWindowModel = Field(
        description="jobs' processes whose run records were updated in the last 7 days (warm-ups are not jobs)")
    by_function_saved: list[FunctionSavedModel] = Field(
        default_factory=list, description="top 100 functions by compile seconds their entries (in the cache now) saved")
    misses_by_cause: MissesByCause = Field(
        description="jobs' misses over the last 24 h and 7 d by cause, with the compile seconds each cause cost")


class RescanModel(BaseModel):
    cache: str
    added: int
    removed: int
    updated: int
    entries: int
    seconds: float
    records_ingested: int = Field(0, description="run records read because they were new or changed")
    records_malformed: int = Field(0, description="run records skipped as malformed (one warning per rescan)")
    warmups_ingested: int = Field(0, description="warm-up coverage records read because they were new or changed")
    records_compacted: int = Field(0, description="run records (processes) older than JAXCACHE_RECORDS_RETAIN_D "
                                                  "folded into per-key history, their runs and files deleted")
    skipped: int = Field(0, description="objects named like entries or records that were not read (not regular "
                                        "files, names the storage cannot map): see GET /v1/caches")
