"""The job views' API shapes: jobs as their records describe them (totals, misses, processes, working sets), and
why jobs missed (a miss's cause, what differs, the fix)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from jaxcache.service.web.fields import CAUSE_HELP, SAVED_HELP, SAVED_WRITER_HELP, Cause

#: jaxcache.keyparts.ORDER: the parts of a key, in the order JAX hashes them.
Part = Literal["computation", "jaxlib", "backend", "xla_flags", "compile_options", "devices", "compression",
               "custom_hook"]


class PartDifference(BaseModel):
    """One part of the key that differs from the nearest key's, with both values where records show them."""

    part: Part
    mine: str | None = Field(None, description="the value in the job that missed", examples=["0.12.0"])
    theirs: str | None = Field(None, description="the value in the run that wrote the nearest key",
                               examples=["0.10.2"])
    changes: list[str] = Field(default_factory=list, description="what changed, in words",
                               examples=[["argument 0: f32[32,128] → f32[16,128]"]])


class MissExplanation(BaseModel):
    """The explanation of a miss: null fields while it is not explained yet (a miss ingested before explanations,
    or by a replica of an older version)."""

    cause: Cause | None = Field(None, description=CAUSE_HELP)
    differs: list[PartDifference] = Field(default_factory=list, description="the parts that differ from the "
                                          "nearest key's, in the order JAX hashes them")
    nearest: str | None = Field(None, description="the key of the same function the miss was compared with")
    fix: str | None = Field(None, description="what to do about it, in one line")


class JobSummary(BaseModel):
    job: str = Field(examples=["llama-pretrain"])
    runs: int
    processes: int
    hits: int
    misses: int = Field(description="programs compiled because the cache did not have them")
    writes: int
    hit_rate: float | None = Field(None, examples=[0.97])
    compile_s: float = Field(description="compile s spent: compile seconds spent on misses (measured)")
    saved_s: float = Field(description=SAVED_HELP)
    saved_writer_s: float = Field(0.0, description=SAVED_WRITER_HELP)
    first_run_s: float
    last_run_s: float = Field(description="Unix time of the newest record update")
    jax: list[str] = Field(examples=[["0.12.0"]])
    jaxlib: list[str] = Field(examples=[["0.12.0"]])
    topologies: list[str] = Field(examples=[["4x8x1"]])


class JobList(BaseModel):
    jobs: list[JobSummary]


class JobMiss(MissExplanation):
    """A key the job compiled because the cache did not give it, for one cause: a key that missed for two causes
    (a changed program, then a run that found it unwritten) is two of these. Explained by its most recent miss of
    that cause; the same misses, causes and seconds as `jaxcache explain --job` and the cache's misses by cause."""

    key: str
    function: str
    misses: int = Field(description="misses of the key for this cause: one per process that compiled it because "
                                    "the cache did not give it")
    compiles: int
    compile_s: float = Field(description="compile s spent: measured compile seconds, over the job's processes")
    written: bool = Field(description="a process of the job wrote it to the cache")
    reason: str | None = Field(None, description="why it was not written, as JAX said")
    in_cache: bool = Field(description="the cache holds the entry now")


class LocalTier(BaseModel):
    """What a process's node-local tier did (``enable_cache(local_dir=...)``), as its latest run record says; counts,
    bytes and seconds are the process's totals."""

    directory: str = Field(description="the node-local directory JAX read")
    loaded: int = Field(description="JAX's lookups answered from the local directory")
    loaded_bytes: int
    fetched: int = Field(description="missing locally, fetched from the shared root on demand, checked and admitted")
    fetched_bytes: int
    fetched_s: float
    skipped: int = Field(description="fetched, and refused as unverified by the job's verify mode (compiled instead)")
    uploaded: int = Field(description="written by JAX locally, and created in the shared root")
    uploaded_bytes: int
    uploaded_s: float
    upload_failed: int = Field(description="uploads that failed (tried again at the next start)")
    upload_pending: int = Field(description="uploads not finished when the process exited")
    dropped: int = Field(description="local copies removed during the run, each when JAX asked for it or at the "
                         "daily sweep: gone from the root, replaced, or judged bad")
    evicted: int = Field(description="local copies evicted to stay under the size cap")
    upload_refused: int = Field(0, description="resumed uploads refused: the local file is not the bytes JAX put")
    healed: int = Field(0, description="entries found at start without their -atime: healed or, broken, removed")
    prefetch_wanted: int = Field(0, description="keys of the job's working set the process was to prefetch")
    prefetched: int = Field(0, description="of those, fetched before JAX asked, checked and admitted")
    prefetched_bytes: int = 0
    prefetched_s: float = Field(0.0, description="seconds from enable_cache until the last prefetched key was in")
    prefetch_waited: int = Field(0, description="JAX's lookups that waited for a prefetch under way")
    prefetch_unused: int = Field(0, description="prefetched keys JAX never asked for (a working set too wide)")


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
    saved_s: float = Field(description=SAVED_HELP)
    saved_writer_s: float = Field(0.0, description=SAVED_WRITER_HELP)
    machine: str | None = Field(None, description="where the process compiled: its device kind and CPU cores",
                                examples=["TPU v5 lite, 224 cores"])
    local: LocalTier | None = Field(None, description="what the process's node-local tier did; null: it had none")


class JobDetail(JobSummary):
    missed: list[JobMiss] = Field(description="the job's misses by key and cause, most compile seconds first (at most "
                                              "1000), each with its cause, what differs, the nearest key and the fix")
    recent_runs: list[JobRun] = Field(description="the job's processes, newest record first (at most 100)")


class WorkingSet(BaseModel):
    """The keys a job is expected to need (``jaxcache.working_set.WorkingSet``'s JSON): what its newest matching
    runs hit or wrote, in the order the newest first used them, then its warm-ups' keys."""

    job: str = Field(examples=["llama-pretrain"])
    keys: list[str] = Field(description="in order of expected use; empty when no run or warm-up matches")
    sha256: dict[str, str] = Field(description="a key's digest as its writer recorded it (the one that counts), "
                                               "for the keys that have one")
    fingerprint: dict[str, Any] | None = Field(description="of the newest run (or warm-up) the set came from: "
                                                           "the fields the request did not give come from it")
    runs: list[str] = Field(description="the run ids the set came from, newest first")
    warmups: list[str] = Field(description="the warm-up ids it came from, newest first")
