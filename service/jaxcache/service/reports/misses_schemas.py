"""Why jobs missed, as the API answers it: a miss's cause, what differs, the fix, and misses by cause."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

#: jaxcache.explain.CAUSES, in the order they are decided (a test checks the two agree).
Cause = Literal["skipped", "evicted", "unreadable", "not_written", "new_program", "unstable_program",
                "program_changed", "jaxlib", "backend", "xla_flags", "compile_options", "devices", "compression",
                "custom_hook", "unknown"]
#: jaxcache.keyparts.ORDER: the parts of a key, in the order JAX hashes them.
Part = Literal["computation", "jaxlib", "backend", "xla_flags", "compile_options", "devices", "compression",
               "custom_hook"]

CAUSE_HELP = (
    "why the cache did not give the program: skipped (the job's verify mode refused the entry; fix says why and what"
    " removes it), evicted (deleted: the prune or DELETE is named in fix), unreadable "
    "(the entry is there but cannot be loaded), not_written (an earlier run compiled it and JAX did not store it), "
    "new_program (the first time this cache sees the function), unstable_program (the same job's program differs "
    "every run), program_changed (the function changed: its signature or body), or the part of the key that "
    "differs from the nearest key of the function (jaxlib, backend, xla_flags, compile_options, devices, "
    "compression, custom_hook); unknown when nothing recorded tells"
)


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


class CauseTotal(BaseModel):
    cause: Cause = Field(description=CAUSE_HELP)
    misses: int = Field(description="jobs' misses of this cause (one per process and key)")
    compile_s: float = Field(description="compile seconds those misses spent (measured by the jobs)")


class CausesWindow(BaseModel):
    since_s: float = Field(description="start of the window (Unix time)")
    causes: list[CauseTotal] = Field(description="causes, most compile seconds lost first")
    unexplained: int = Field(0, description="jobs' misses in the window not explained yet (ingested before "
                                            "explanations, or by a replica of an older version)")


class MissesByCause(BaseModel):
    last_24h: CausesWindow = Field(description="jobs' processes whose run records were updated in the last 24 h "
                                               "(warm-ups are not jobs)")
    last_7d: CausesWindow = Field(description="jobs' processes whose run records were updated in the last 7 days")
