"""Integrity passes and verdicts."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from jaxcache.service.web import fields
from jaxcache.service.web.fields import DigestConflict, integral

#: Keys a digests request may name. JAXCACHE_MAX_BODY_BYTES bounds them first (about 700 keys in its default 64 KiB,
#: a 413 beyond): the route refuses more (422) where the limit was raised. Not the schema's maxItems, which a body
#: over the limit would answer 413 instead of the 422 a schema violation gets.
MAX_DIGEST_KEYS = 10_000


class VerifyRequest(BaseModel):
    """Options of an on-demand integrity pass."""

    model_config = ConfigDict(extra="forbid", strict=True)  # `"recheck_all": 0` is a mistake, not a false
    max_entries: Annotated[int, Field(ge=1, le=10_000_000), integral] | None = Field(
        None, description="stop after this many (resume later)")
    recheck_all: bool = Field(False, description="forget stored verdicts and read every entry again")


class VerifyResult(BaseModel):
    cache: str
    checked: int = Field(description="entries read and judged by this pass")
    bytes_read: int
    counts: dict[str, int] = Field(description="this pass's verdicts by class")
    remaining: int = Field(description="entries still to verify (new, changed, pending, or beyond max_entries)")
    seconds: float


class IntegrityProblem(BaseModel):
    key: str
    class_: str = Field(alias="class", description="tampered, mismatched, differs, corrupt or pending; any class"
                        " where `signature` names a bad signature")
    classes: list[str] = Field(description="every class that applies, most severe first")
    reasons: list[str]
    sha256: str | None = None
    attested_sha256: str | None = None
    attested_by: str | None = None
    embedded_module: str | None = None
    checked_s: float
    signature: str | None = Field(None, description=(
        "`bad signature`: a signature beside the entry is malformed, for another key, or claims a trusted key and does"
        " not verify. It proves nothing, and the class stays what the entry's bytes prove; someone who could write"
        " the root put it there (null: none)"))
    held_up: bool = Field(False, description="proven bad (tampered, corrupt, or a mismatch where its check is "
                          "pinned): JAX never overwrites an entry, so no job gets a good one for this key until "
                          "this one is removed")


class IntegritySummary(BaseModel):
    """Integrity of a cache's entries, from the last verification of each."""

    cache: str
    entries: int
    verified: int
    unverified: int = Field(description="entries not verified yet (new since the last pass)")
    attested: int = Field(description="entries with a digest recorded by their writer")
    counts: dict[str, int] = Field(description="ok, tampered, mismatched, differs, corrupt, pending, unattested",
                                   examples=[{"ok": 120, "tampered": 1, "mismatched": 0, "corrupt": 2,
                                              "pending": 0, "unattested": 40}])
    bad_signatures: int = Field(0, description="entries with a bad signature beside them, whatever their class")
    last_checked_s: float | None = None
    problems: list[IntegrityProblem] = Field(
        description="tampered, mismatched, differing, corrupt and pending entries, and any with a bad signature")
    held_up: int = Field(0, description="keys held up by a proven-bad entry (problems with held_up), all of them")
    conflicts: list[DigestConflict] = Field(
        default_factory=list, description="entries with more than one recorded digest (the first accepted counts)")


class DigestsRequest(BaseModel):
    """The keys whose attested digests a job asks about, for the cache whose root it names."""

    model_config = ConfigDict(extra="forbid", strict=True)
    cache_dir: Annotated[str, Field(max_length=1024, pattern=fields.CACHE_DIR, examples=["/mnt/jax-cache"],
                                    description="the root, as GET /v1/integrity takes it")]
    keys: list[Annotated[str, Field(max_length=600, pattern=fields.KEY)]] = Field(
        description="entry keys (<function>-<64 lower-case hex>), at most 10,000 (422), within JAXCACHE_MAX_BODY_BYTES"
                    " (413)")


class AttestedDigest(BaseModel):
    sha256: str = Field(description="the digest the entry is judged against: its first accepted writer's")
    size_bytes: int
    writer: str = Field(description="who recorded it (information, never proof)")


class AttestedDigests(BaseModel):
    """The digests the service judges the asked keys' entries against."""

    cache: str
    digests: dict[str, AttestedDigest] = Field(description="the asked keys with a recorded digest; a key without "
                                               "one is absent")
    conflicts: list[DigestConflict] = Field(
        default_factory=list, description="asked keys for which writers recorded other digests too (the one in "
        "`digests` counts)")
