"""What ingesting a POSTed run record did, as the API answers it."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ReportResult(BaseModel):
    cache: str = Field(examples=["prod"])
    run_id: str
    process_index: int
    runs: int = Field(description="processes stored (0 when a newer version of this record was already there)")
    keys: int = Field(description="per-key rows stored for the process")
    stale: bool = Field(description="an older version of a record already ingested: nothing changed")
