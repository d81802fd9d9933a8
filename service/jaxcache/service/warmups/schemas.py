"""Warm-ups from their coverage records, and what jobs hit since."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WarmupSummary(BaseModel):
    """One warm-up run (from its coverage record) and how much of it jobs have used since."""

    id: str = Field(examples=["20261130T153524Z-5af55f74"])
    job: str = Field(examples=["llm-4x8x1"])
    topology: str = Field(examples=["4x8x1", "v5e:4x8", "2xv5e:16x16"])
    platform: str = Field(examples=["gpu"])
    gpu_model: str | None = Field(None, examples=["NVIDIA H100 80GB HBM3"])
    started_s: float
    finished_s: float
    programs: int = Field(description="programs the warm-up compiled or found")
    written: int = Field(description="programs it stored")
    already_warm: int = Field(description="programs already in the cache")
    not_written: int = Field(description="programs JAX compiled but did not store")
    compile_s: float = Field(description="compile s spent: the warm-up's compile seconds, measured on its machine")
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
