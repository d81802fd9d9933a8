"""Run records POSTed by jobs, and what ingesting one did."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
