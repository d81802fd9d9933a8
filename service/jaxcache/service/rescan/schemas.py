"""What a rescan answers."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RescanModel(BaseModel):
    cache: str
    added: int
    removed: int
    updated: int
    entries: int
    seconds: float
    records_ingested: int = Field(0, description="run records read because they were new or changed")
    records_malformed: int = Field(0, description="run records skipped as malformed (one warning per rescan)")
    warmups_ingested: int = Field(0, description="warm-up coverage records read because they were new or changed")
    records_compacted: int = Field(0, description="run records (processes) older than JAXCACHE_RECORDS_RETAIN_D "
                                                  "folded into per-key history, their runs and files deleted")
    skipped: int = Field(0, description="objects named like entries or records that were not read (not regular "
                                        "files, names the storage cannot map): see GET /v1/caches")
