"""The caches and their statistics, as the API answers them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from jaxcache.service.catalog.models import SKIPPED_SHOWN
from jaxcache.service.web.fields import CAUSE_HELP, SAVED_HELP, SAVED_WRITER_HELP, Cause


class SkippedObject(BaseModel):
    name: str = Field(description="the object's name under the root, with control, bidirectional and other "
                                  "invisible characters escaped (\\u202e) and a backslash doubled",
                      examples=["jit_a\\\\b-0f3a...-cache"])
    why: str = Field(examples=["a FIFO, not a regular file"])


#: What a cache's figures are: ``ok`` (its last scan succeeded), ``pending`` (never scanned yet, the first scan to
#: come), ``failing`` (its last scan failed: the figures are the last good scan's, or none), ``unreachable`` (its
#: root did not answer this replica's last look: the same).
ScanState = Literal["ok", "pending", "failing", "unreachable"]
SCAN_STATE_HELP = (
    "ok: the last scan succeeded; pending: not scanned yet (entries and sizes are 0 until the first scan, not an "
    "empty cache); failing: the last scan failed (last_scan_error; the figures are the last good scan's, or none "
    "when last_scan_s is null); unreachable: the root did not answer this replica's last look (root_error), the "
    "figures as for failing")


class CacheSummary(BaseModel):
    name: str = Field(examples=["prod"])
    url: str = Field(examples=["gs://ml-jax-cache/prod"])
    entries: int
    size_bytes: int
    scan_state: ScanState = Field(description=SCAN_STATE_HELP)
    reachable: bool | None = Field(None, description=(
        "whether the root answered this replica's last look (within JAXCACHE_REACH_S; looked at again when asked, "
        "10 s on, and before each rescan); null before its first look ends"))
    unreachable_since_s: float | None = Field(None, description="Unix time the root's looks began to fail (null while "
                                                                "it answers)")
    root_error: str | None = Field(None, description="why the root could not be reached at the last look: the "
                                                     "store's error, or no answer within JAXCACHE_REACH_S")
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
    compile_seconds: int = Field(description="stored compile s: the whole seconds JAX stored in them, summed")


class FunctionSavedModel(BaseModel):
    function: str
    entries: int = Field(description="entries of the function that saved time")
    hits: int
    saved_s: float = Field(description=SAVED_HELP)
    saved_writer_s: float = Field(0.0, description=SAVED_WRITER_HELP)


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
    saved_s: float = Field(description=SAVED_HELP)
    saved_writer_s: float = Field(0.0, description=SAVED_WRITER_HELP)


class CauseTotal(BaseModel):
    cause: Cause = Field(description=CAUSE_HELP)
    misses: int = Field(description="jobs' misses of this cause (one per process and key)")
    compile_s: float = Field(description="compile s spent: compile seconds those misses spent (measured by the jobs)")


class CausesWindow(BaseModel):
    since_s: float = Field(description="start of the window (Unix time)")
    causes: list[CauseTotal] = Field(description="causes, most compile seconds lost first")
    unexplained: int = Field(0, description="jobs' misses in the window not explained yet (ingested before "
                                            "explanations, or by a replica of an older version)")


class MissesByCause(BaseModel):
    last_24h: CausesWindow = Field(description="jobs' processes whose run records were updated in the last 24 h "
                                               "(warm-ups are not jobs)")
    last_7d: CausesWindow = Field(description="jobs' processes whose run records were updated in the last 7 days")


class StatsModel(BaseModel):
    cache: str
    scan_state: ScanState = Field(description=SCAN_STATE_HELP + " (as GET /v1/caches says it; within the minute "
                                  "under an ETag, which moves with the minute)")
    entries: int
    size_bytes: int
    compile_seconds: int = Field(description="stored compile s: the whole seconds JAX stored in the entries, summed")
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
