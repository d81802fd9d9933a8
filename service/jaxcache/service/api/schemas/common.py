"""Answers every part of the API shares: errors and health."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: str
    detail: dict[str, str] = Field(default_factory=dict)


class ErrorModel(BaseModel):
    detail: str
