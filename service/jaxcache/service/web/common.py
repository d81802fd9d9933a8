"""Answers every part of the API shares: errors and health."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

LoopHealthName = Literal["ok", "failing", "stuck"]


class LoopModel(BaseModel):
    """A background loop: when it last finished a round without error, its last error, rounds failed in a row, and
    how it is doing now (a stuck or failing loop never makes the replica unready)."""

    last_success_s: float | None = None
    last_error: str | None = None
    last_error_s: float | None = None
    failures: int = 0
    state: LoopHealthName = Field("ok", description="stuck: the pass running now has run past stuck_after_s (a "
                                  "verification: since its last batch); failing: its last round failed; else ok")
    running_since_s: float | None = Field(None, description="when the pass running now started; null between "
                                          "passes")
    running_cache: str | None = Field(None, description="the cache the running pass is on")
    stuck_after_s: float | None = Field(None, description="how long a pass may run before it is stuck "
                                        "(JAXCACHE_STUCK_AFTER_S, else 3 periods and at least 600 s)")
    caches: dict[str, LoopHealthName] = Field(
        default_factory=dict, description="each cache: stuck (the running pass is blocked on it), failing (its "
        "part of the last round failed) or ok")


class Health(BaseModel):
    status: str
    detail: dict[str, str] = Field(default_factory=dict)


class Readiness(Health):
    loops: dict[str, LoopModel] = Field(default_factory=dict, description="background loops (rescan, verify)")


class ErrorModel(BaseModel):
    detail: str


class ValidationProblem(BaseModel):
    """One problem FastAPI found in a request (its own 422 answers list them)."""

    loc: list[str | int] = Field(description="where: query, path or body, then the field",
                                 examples=[["query", "limit"]])
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class UnprocessableModel(BaseModel):
    """A 422: a list when the request does not match the schema, a string when a route refuses what it read."""

    detail: str | list[ValidationProblem]
