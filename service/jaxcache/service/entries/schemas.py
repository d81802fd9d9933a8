"""Entries: a listing page, one entry and the jobs that used it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from jaxcache.service.web.fields import CURSOR, SAVED_HELP, DigestConflict
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
    machine: str | None = Field(None, description=(
        "where the writer compiled: its own device kind and CPU cores, as its run record says (a warm-up that compiled"
        " for a TPU slice from a CPU node says the node's); its `measured_compile_s` is this machine's time"),
        examples=["cpu, 2 cores"])


class EntryModel(BaseModel):
    key: str = Field(examples=["jit_train_step-74b295daef28036aaea5500f2ef5877805eddd3a0db96fb5a7850a99a0735906"])
    function: str = Field(examples=["jit_train_step"])
    size_bytes: int
    created_s: float
    last_used_s: float = Field(description="newest of the -atime file, the last reported hit and creation")
    has_atime: bool
    compression: str | None = Field(None, examples=["zstd"])
    compile_seconds: int | None = Field(None, description=(
        "stored compile s: the writer's compile time as JAX stores it in the entry, whole seconds, truncated"))
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
        None, description=("writer's compile s: compile seconds measured by the first writer, on its machine"
                           " (`first_writer.machine`; not JAX's truncated whole seconds)"), examples=[41.7])
    saved_s: float = Field(0.0, description=(
        "saved s: compile seconds the reported hits saved so far, each hit credited as `saved_basis` says, less the"
        " seconds it took loading"), examples=[1250.4])
    platform_compile_s: float | None = Field(None, description=(
        "platform compile s: the compile seconds the first job that compiled the key measured, on the device kind the"
        " key is for (null: no job compiled it yet, only its writer, a warm-up say)"), examples=[11.0])
    platform_machine: str | None = Field(None, description="where that job compiled it (device kind, CPU cores)",
                                         examples=["TPU v5 lite, 224 cores"])
    saved_basis: Literal["platform", "writer", "stored"] = Field("stored", description=(
        "what each hit is credited with in `saved_s`: `platform` (platform_compile_s: measured on the key's own"
        " platform), `writer` (measured_compile_s: the writer's time, on its machine, `first_writer.machine`) or"
        " `stored` (compile_seconds: JAX's stored whole seconds, the writer's time truncated; no run record measured"
        " it)"))
    first_writer: WriterModel | None = Field(None, description="null until a run record reports the write")


class EntryJobModel(BaseModel):
    """What one job did with one entry, over all its reported processes."""

    job: str
    hits: int
    compiles: int
    writes: int
    processes: int
    last_s: float | None = Field(None, description="Unix time of the job's last reported use of the key")
    saved_s: float = Field(description=SAVED_HELP)


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
