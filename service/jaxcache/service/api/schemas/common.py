"""Answers every part of the API shares: errors and health."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class LoopModel(BaseModel):
    """A background loop: when it last finished a round without error, its last error, rounds failed in a row."""

    last_success_s: float | None = None
    last_error: str | None = None
    last_error_s: float | None = None
    failures: int = 0


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
