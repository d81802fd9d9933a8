"""Entries: a listing page, one entry and the jobs that used it."""

from __future__ import annotations

from pydantic import BaseModel, Field

from jaxcache.service.web.fields import CURSOR, DigestConflict
from jaxcache.storage import STORES

#: What `version` holds on each store (the storage package's own words for its stores).
VERSION_HELP = (
    "the stored object's version: an opaque token that a replaced object does not keep (on S3, one rewritten with the"
    " same bytes does), and the precondition of a prune's delete. It holds "
    + "; ".join(f"on {s.scheme}:// roots {s.version_help}" for s in STORES.values())
    + "; null on a directory (local or NFS), where size and mtime stand for it. Compare it for equality only")


class WriterModel(BaseModel):
    """The process that first wrote an entry, from run records (JAX's key cannot be read back)."""

    job: str = Field(examples=["llama-pretrain"])
    run_id: str = Field(examples=["20261130-0815-a1b2c3"])
    process_index: int = Field(examples=[0])
    host: str | None = Field(None, examples=["gpu-node-17"])
    topology: str | None = Field(None, examples=["4x8x1", "v5e:4x8", "2xv5e:16x16"])
    jax: str | None = Field(None, examples=["0.12.0"])
    jaxlib: str | None = Field(None, examples=["0.12.0"])
    at_s: float | None = Field(None, description="Unix time of the write (the writer's first use of the key)")


class EntryModel(BaseModel):
    key: str = Field(examples=["jit_train_step-74b295daef28036aaea5500f2ef5877805eddd3a0db96fb5a7850a99a0735906"])
    function: str = Field(examples=["jit_train_step"])
    size_bytes: int
    created_s: float
    last_used_s: float = Field(description="newest of the -atime file, the last reported hit and creation")
    has_atime: bool
    compression: str | None = Field(None, examples=["zstd"])
    compile_seconds: int | None = Field(None, description="as JAX stores it: whole seconds, truncated")
    status: str | None = Field(None, examples=["ok"])
    reason: str | None = None
    version: str | None = Field(None, description=VERSION_HELP,
                                examples=["1718000000000000", '"9a0364b9e99bb480dd25e1f0284c8555"'])
    generation: int | None = Field(None, description=(
        "the object's GCS generation, as an integer, on a gs:// root (the same number as `version`); null on every"
        " other root. Kept for clients that read it before `version` came: read `version` instead"),
        examples=[1718000000000000])
    hits: int = Field(0, description="hits reported by run records")
    last_hit_s: float | None = Field(None, description="Unix time of the last reported hit")
    measured_compile_s: float | None = Field(
        None, description="compile seconds measured by the first writer (not JAX's truncated whole seconds)",
        examples=[41.7])
    saved_s: float = Field(0.0, description="compile seconds the reported hits saved so far", examples=[1250.4])
    first_writer: WriterModel | None = Field(None, description="null until a run record reports the write")


class EntryJobModel(BaseModel):
    """What one job did with one entry, over all its reported processes."""

    job: str
    hits: int
    compiles: int
    writes: int
    processes: int
    last_s: float | None = Field(None, description="Unix time of the job's last reported use of the key")
    saved_s: float


class EntryDetail(EntryModel):
    jobs: list[EntryJobModel] = Field(default_factory=list, description="every job whose records name the key")
    integrity: str | None = Field(None, description="last integrity verdict: ok, tampered, mismatched, corrupt, "
                                                    "pending or unattested; null before the first verification")
    integrity_reasons: list[str] = Field(default_factory=list)
    integrity_signature: str | None = Field(None, description=(
        "`bad signature` when a signature beside the entry is malformed, for another key, or does not verify (it"
        " proves nothing; `integrity` is what the bytes prove); null: none"))
    sha256: str | None = Field(None, description="digest of the stored bytes at the last verification")
    attested_by: str | None = Field(None, description="the writer that recorded the expected digest")
    conflict: DigestConflict | None = Field(None, description=(
        "other digests recorded for the key, which disagree with the one that counts; unsigned, they prove nothing"
        " (null: no disagreement)"))


class EntryPage(BaseModel):
    entries: list[EntryModel]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null on the last page",
                                    json_schema_extra={"pattern": CURSOR})
