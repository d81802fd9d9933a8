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


class WriterModel(BaseModel):
    """The process that first wrote an entry, from run records (JAX's key cannot be read back)."""

    job: str = Field(examples=["llama-pretrain"])
    run_id: str = Field(examples=["20261130-0815-a1b2c3"])
    process_index: int = Field(examples=[0])
    host: str | None = Field(None, examples=["gpu-node-17"])
    topology: str | None = Field(None, examples=["4x8x1"])
    jax: str | None = Field(None, examples=["0.12.0"])
    jaxlib: str | None = Field(None, examples=["0.12.0"])
    at_s: float | None = Field(None, description="Unix time of the write (the writer's first use of the key)")


class EntryModel(BaseModel):
    key: str = Field(examples=["jit_train_step-74b295daef28036aaea5500f2ef5877805eddd3a0db96fb5a7850a99a0735906"])
    function: str = Field(examples=["jit_train_step"])
    size_bytes: int
    created_s: float
    last_used_s: float = Field(description="newest of the -atime file, the last reported hit and creation")
    has_atime: bool
    compression: str | None = Field(None, examples=["zstd"])
    compile_seconds: int | None = Field(None, description="as JAX stores it: whole seconds, truncated")
    status: str | None = Field(None, examples=["ok"])
    reason: str | None = None
    generation: int | None = Field(None, description="GCS object generation")
    hits: int = Field(0, description="hits reported by run records")
    last_hit_s: float | None = Field(None, description="Unix time of the last reported hit")
    measured_compile_s: float | None = Field(
        None, description="compile seconds measured by the first writer (not JAX's truncated whole seconds)",
        examples=[41.7])
    saved_s: float = Field(0.0, description="compile seconds the reported hits saved so far", examples=[1250.4])
    first_writer: WriterModel | None = Field(None, description="null until a run record reports the write")


class EntryJobModel(BaseModel):
    """What one job did with one entry, over all its reported processes."""

    job: str
    hits: int
    compiles: int
    writes: int
    processes: int
    last_s: float | None = Field(None, description="Unix time of the job's last reported use of the key")
    saved_s: float


class EntryDetail(EntryModel):
    jobs: list[EntryJobModel] = Field(default_factory=list, description="every job whose records name the key")
    integrity: str | None = Field(None, description="last integrity verdict: ok, tampered, mismatched, corrupt, "
                                                    "pending or unattested; null before the first verification")
    integrity_reasons: list[str] = Field(default_factory=list)
    sha256: str | None = Field(None, description="digest of the stored bytes at the last verification")
    attested_by: str | None = Field(None, description="the writer that recorded the expected digest")


class EntryPage(BaseModel):
    entries: list[EntryModel]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null on the last page")


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
    bytes_per_day: float = Field(description="mean bytes added per day over the last 7 days")
    last_24h: UsageWindowModel = Field(description="processes whose run records were updated in the last 24 h")
    last_7d: UsageWindowModel = Field(description="processes whose run records were updated in the last 7 days")
    by_function_saved: list[FunctionSavedModel] = Field(
        default_factory=list, description="top 100 functions by compile seconds their entries (in the cache now) saved")


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
    stale_jaxlib: bool = Field(False, description="entries whose first writer's jaxlib no run used within "
                                                  "stale_jaxlib_window (they can never hit again)")
    stale_jaxlib_window: float | str | None = Field(None, description="default 14d; only with stale_jaxlib")
    integrity: list[Literal["tampered", "mismatched", "corrupt"]] = Field(
        default_factory=list, description="entries whose integrity verdict is one of these (an integrity pass runs "
                                          "first over entries not yet judged)")


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
    notes: list[str] = Field(default_factory=list, description="rules that could not select, and why")


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
    records_ingested: int = Field(0, description="run records read because they were new or changed")
    records_malformed: int = Field(0, description="run records skipped as malformed (each logged once)")
    warmups_ingested: int = Field(0, description="warm-up coverage records read because they were new or changed")


class FingerprintModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    jax: str = Field(examples=["0.12.0"])
    jaxlib: str = Field(examples=["0.12.0"])
    backend: str | None = Field(None, examples=["gpu"])
    device_kind: str | None = Field(None, examples=["NVIDIA H100 80GB HBM3"])
    device_count: int | None = None
    local_device_count: int | None = None
    process_count: int | None = None
    compression: str | None = Field(None, examples=["zstandard"])
    xla_flags_digest: str | None = None
    xla_caches: str | None = Field(None, examples=["none"])


class KeyUsageModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    key: str = Field(examples=["jit_train_step-74b295daef28036aaea5500f2ef5877805eddd3a0db96fb5a7850a99a0735906"])
    event: Literal["hit", "write", "compiled"]
    function: str | None = None
    hits: int | None = Field(None, ge=0)
    compiles: int | None = Field(None, ge=0)
    writes: int | None = Field(None, ge=0)
    reason: str | None = Field(None, description="why a compiled program was not written")
    compile_s: float | None = Field(None, ge=0, description="measured compile seconds")
    retrieval_s: float | None = Field(None, ge=0)
    saved_s: float | None = Field(None, description="JAX's figure: stored whole seconds minus retrieval")
    size_bytes: int | None = Field(None, ge=0)
    first_at: float | None = Field(None, ge=0)
    last_at: float | None = Field(None, ge=0)


class RunRecordModel(BaseModel):
    """A run record (``jaxcache.run/1``), as jobs write under ``<root>/.jaxcache/runs/`` and POST."""

    model_config = ConfigDict(extra="allow")

    schema_: Literal["jaxcache.run/1"] = Field(alias="schema")
    job: str = Field(examples=["llama-pretrain"])
    run_id: str = Field(examples=["20261130-0815-a1b2c3"])
    process_index: int = Field(ge=0)
    process_count: int = Field(ge=1)
    host: str
    started_at: float = Field(ge=0)
    updated_at: float = Field(ge=0)
    fingerprint: FingerprintModel
    topology: str | None = Field(None, examples=["4x8x1"])
    cache_dir: str | None = Field(None, examples=["gs://ml-jax-cache/prod"])
    final: bool = False
    pid: int | None = None
    keys: list[KeyUsageModel] = Field(default_factory=list)


class ReportResult(BaseModel):
    cache: str = Field(examples=["prod"])
    run_id: str
    process_index: int
    runs: int = Field(description="processes stored (0 when a newer version of this record was already there)")
    keys: int = Field(description="per-key rows stored for the process")
    stale: bool = Field(description="an older version of a record already ingested: nothing changed")


class ReportErrorModel(BaseModel):
    detail: str | list[dict] = Field(description="what is wrong (a list for malformed query parameters)")


class JobSummary(BaseModel):
    job: str = Field(examples=["llama-pretrain"])
    runs: int
    processes: int
    hits: int
    misses: int = Field(description="programs compiled because the cache did not have them")
    writes: int
    hit_rate: float | None = Field(None, examples=[0.97])
    compile_s: float = Field(description="compile seconds spent on misses (measured)")
    saved_s: float = Field(description="compile seconds saved by hits")
    first_run_s: float
    last_run_s: float = Field(description="Unix time of the newest record update")
    jax: list[str] = Field(examples=[["0.12.0"]])
    jaxlib: list[str] = Field(examples=[["0.12.0"]])
    topologies: list[str] = Field(examples=[["4x8x1"]])


class JobList(BaseModel):
    jobs: list[JobSummary]


class JobMiss(BaseModel):
    key: str
    function: str
    compiles: int
    compile_s: float = Field(description="measured compile seconds, over the job's processes")
    written: bool = Field(description="a process of the job wrote it to the cache")
    reason: str | None = Field(None, description="why it was not written, as JAX said")
    in_cache: bool = Field(description="the cache holds the entry now")


class JobRun(BaseModel):
    run_id: str
    process_index: int
    process_count: int
    host: str
    topology: str | None = None
    jax: str
    jaxlib: str
    fingerprint_digest: str = Field(description="equal digests: the same key inputs besides the program")
    started_s: float
    updated_s: float
    final: bool
    hits: int
    misses: int
    writes: int
    hit_rate: float | None = None
    saved_s: float


class JobDetail(JobSummary):
    missed: list[JobMiss] = Field(description="the job's misses, most compile seconds first (at most 1000)")
    recent_runs: list[JobRun] = Field(description="the job's processes, newest record first (at most 100)")


class Health(BaseModel):
    status: str
    detail: dict[str, str] = Field(default_factory=dict)


class ErrorModel(BaseModel):
    detail: str


class WarmupSummary(BaseModel):
    """One warm-up run (from its coverage record) and how much of it jobs have used since."""

    id: str = Field(examples=["20261130T153524Z-5af55f74"])
    job: str = Field(examples=["llm-4x8x1"])
    topology: str = Field(examples=["4x8x1"])
    platform: str = Field(examples=["gpu"])
    gpu_model: str | None = Field(None, examples=["NVIDIA H100 80GB HBM3"])
    started_s: float
    finished_s: float
    programs: int = Field(description="programs the warm-up compiled or found")
    written: int = Field(description="programs it stored")
    already_warm: int = Field(description="programs already in the cache")
    not_written: int = Field(description="programs JAX compiled but did not store")
    compile_s: float = Field(description="seconds spent compiling")
    hit_since: int = Field(description="of its programs, how many jobs have reported a hit on since it finished")


class WarmupList(BaseModel):
    warmups: list[WarmupSummary]


class WarmupKey(BaseModel):
    key: str
    function: str
    status: str = Field(description="written, present (already cached) or not_written")
    compile_s: float | None = None
    size_bytes: int | None = None
    hits: int = Field(0, description="hits reported by jobs on this key, all time")
    last_hit_s: float | None = None
    hit_since: bool = Field(False, description="a job hit it after the warm-up finished")


class WarmupDetail(WarmupSummary):
    fingerprint: dict
    keys: list[WarmupKey]


class VerifyRequest(BaseModel):
    """Options of an on-demand integrity pass."""

    model_config = ConfigDict(extra="forbid")
    max_entries: int | None = Field(None, ge=1, le=10_000_000, description="stop after this many (resume later)")
    recheck_all: bool = Field(False, description="forget stored verdicts and read every entry again")


class VerifyResult(BaseModel):
    cache: str
    checked: int = Field(description="entries read and judged by this pass")
    bytes_read: int
    counts: dict[str, int] = Field(description="this pass's verdicts by class")
    remaining: int = Field(description="entries still to verify (new, changed, pending, or beyond max_entries)")
    seconds: float


class IntegrityProblem(BaseModel):
    key: str
    class_: str = Field(alias="class", description="tampered, mismatched, corrupt or pending")
    classes: list[str] = Field(description="every class that applies, most severe first")
    reasons: list[str]
    sha256: str | None = None
    attested_sha256: str | None = None
    attested_by: str | None = None
    embedded_module: str | None = None
    checked_s: float


class IntegritySummary(BaseModel):
    """Integrity of a cache's entries, from the last verification of each."""

    cache: str
    entries: int
    verified: int
    unverified: int = Field(description="entries not verified yet (new since the last pass)")
    attested: int = Field(description="entries with a digest recorded by their writer")
    counts: dict[str, int] = Field(description="ok, tampered, mismatched, corrupt, pending, unattested",
                                   examples=[{"ok": 120, "tampered": 1, "mismatched": 0, "corrupt": 2,
                                              "pending": 0, "unattested": 40}])
    last_checked_s: float | None = None
    problems: list[IntegrityProblem] = Field(description="tampered, mismatched, corrupt and pending entries")
