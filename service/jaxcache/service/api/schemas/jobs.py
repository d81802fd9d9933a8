"""Jobs as their run records describe them: totals, misses, processes."""

from __future__ import annotations

from pydantic import BaseModel, Field

from jaxcache.service.api.schemas.misses import MissExplanation


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


class JobMiss(MissExplanation):
    """A key the job compiled because the cache did not give it, explained by its most recent miss."""

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
    missed: list[JobMiss] = Field(description="the job's misses, most compile seconds first (at most 1000), each "
                                              "with its cause, what differs, the nearest key and the fix")
    recent_runs: list[JobRun] = Field(description="the job's processes, newest record first (at most 100)")
