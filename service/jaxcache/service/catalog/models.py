"""The catalog's tables: an index of every cache root's entries (rebuilt from storage by a rescan), and what only
the catalog holds: pins, the prune audit log, ingested run records (their tables in :mod:`.run_tables`, importable
from here too) and warm-up records, writers' digests, verdicts. The schema is owned by the Alembic revisions in
``migrations/``: a model changed here needs a revision there (a test compares the two).
"""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Boolean, Float, Index, Integer, LargeBinary, text
from sqlalchemy.orm import Mapped, mapped_column

from jaxcache.service.catalog.run_tables import (
    AGGREGATES,
    Aggregates,
    KeyHistoryRow,
    KeyStatsRow,
    ProcessKeysRow,
    RunRow,
    UsageRow,
)
from jaxcache.service.catalog.schema import Base, NullableJSON, Str, max_length, table_of

__all__ = [
    "AGGREGATES", "AttestationConflictRow", "AttestationRow", "Base", "CacheRow", "ChangeCountRow",
    "EntryRow", "InboxRow", "LoopHealthRow",
    "KeyHistoryRow", "KeyStatsRow", "NullableJSON", "PinRow", "ProcessKeysRow", "PruneItemRow", "PruneRow",
    "RecordFileRow", "RunRow", "Str", "UsageRow", "VerificationRow", "WarmupKeyRow", "WarmupRow", "max_length",
    "table_of",
]

class CacheRow(Base):
    """A configured cache root and its last scan."""

    __tablename__ = "caches"
    name: Mapped[str] = mapped_column(Str(64), primary_key=True)
    url: Mapped[str] = mapped_column(Str(1024))
    last_scan_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_scan_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_scan_error: Mapped[str | None] = mapped_column(Str(2048), nullable=True)
    # What the last completed rescan skipped (not regular files, names no backend maps): in the catalog, not in a
    # replica's memory, so that every replica shows the same. The names are escaped for display (and so storable as
    # JSON: a local name that is not UTF-8 holds surrogates): the first few by name (rescan.scan.SKIPPED_SHOWN),
    # each {"name", "why"}.
    last_scan_skipped: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_scan_skipped_names: Mapped[list | None] = mapped_column(NullableJSON, nullable=True)
    # Runs last updated before this were compacted into key_history: a record older than it changes nothing.
    compacted_before_s: Mapped[float | None] = mapped_column(Float, nullable=True)


#: The expression listings sort compile seconds by (see ix_entries_compile_sort; migration 0003 spells it too).
COMPILE_SORT_SQL = "coalesce(compile_seconds, -1)"


class EntryRow(Aggregates, Base):
    """One ``-cache`` file (kind ``entry``) or one orphaned ``-atime`` file (kind ``orphan``), with its key's
    aggregates copied from key_stats whenever either side changes."""

    __tablename__ = "entries"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512), primary_key=True)
    kind: Mapped[str] = mapped_column(Str(8), primary_key=True)
    module: Mapped[str] = mapped_column(Str(448))
    name: Mapped[str] = mapped_column(Str(512))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_s: Mapped[float] = mapped_column(Float)
    # Derived (newest of -atime and creation) but stored: it is what lists sort and prunes select on.
    last_used_s: Mapped[float] = mapped_column(Float)
    generation: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    has_atime: Mapped[bool] = mapped_column(Boolean, default=False)
    atime_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    compression: Mapped[str | None] = mapped_column(Str(16), nullable=True)
    compile_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str | None] = mapped_column(Str(16), nullable=True)
    reason: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    first_seen_s: Mapped[float] = mapped_column(Float)
    # Last use as storage shows it (newest of -atime and creation); last_used_s adds reported hits to it.
    seen_used_s: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("ix_entries_size", "cache", "kind", "size_bytes", "key"),
        Index("ix_entries_last_used", "cache", "kind", "last_used_s", "key"),
        Index("ix_entries_created", "cache", "kind", "created_s", "key"),
        # Listings sort by compile seconds with unknown (NULL) as -1: an index on exactly that expression lets a
        # page (and its cursor's row comparison) be an index range instead of a sort of the whole cache.
        Index("ix_entries_compile_sort", "cache", "kind", text(COMPILE_SORT_SQL), "key"),
        Index("ix_entries_module", "cache", "kind", "module", "created_s", "key"),
        Index("ix_entries_hits", "cache", "kind", "hits", "key"),
        Index("ix_entries_writer_jaxlib", "cache", "kind", "writer_jaxlib"),
        Index("ix_entries_writer_topology", "cache", "kind", "writer_topology"),
    )


class RecordFileRow(Base):
    """A run record object a rescan has read: it is parsed again only when it changes."""

    __tablename__ = "record_files"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    name: Mapped[str] = mapped_column(Str(1024), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    mtime_s: Mapped[float] = mapped_column(Float)
    generation: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    error: Mapped[str | None] = mapped_column(Str(2048), nullable=True)

    # Retention finds the files older than its horizon without reading every row.
    __table_args__ = (Index("ix_record_files_mtime", "cache", "mtime_s"),)


class InboxRow(Base):
    """A run record accepted and not folded yet (``reports/queue.py``): the newest version of one process's record,
    the JSON it came as, zstd-compressed. The drain folds it into the run tables and deletes it."""

    __tablename__ = "report_inbox"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(Str(128), primary_key=True)
    process_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    updated_s: Mapped[float] = mapped_column(Float)  # the record's updated_at: a newer version replaces it
    source: Mapped[str] = mapped_column(Str(16))  # "report" (POSTed) or "storage" (a rescan read its file)
    record: Mapped[str | None] = mapped_column(Str(1024), nullable=True)  # the record file it was read from
    body: Mapped[bytes] = mapped_column(LargeBinary)
    received_s: Mapped[float] = mapped_column(Float)

    # The drain takes a cache's rows oldest first.
    __table_args__ = (Index("ix_report_inbox_received", "cache", "received_s"),)


class ChangeCountRow(Base):
    """How many times a cache's entries and its usage figures have changed (``catalog/database.py``): what
    every process of every replica checks its cached statistics and the listings' ``ETag`` against."""

    __tablename__ = "change_counts"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    entries: Mapped[int] = mapped_column(BigInteger)
    usage: Mapped[int] = mapped_column(BigInteger)


class LoopHealthRow(Base):
    """How one background loop is doing, as the process running its passes last said (``background.py``'s
    ``LoopStatus`` as JSON): any process's ``/readyz`` and ``/metrics`` show every loop."""

    __tablename__ = "loop_health"
    loop: Mapped[str] = mapped_column(Str(32), primary_key=True)
    status: Mapped[dict] = mapped_column(JSON)
    updated_s: Mapped[float] = mapped_column(Float)


class PinRow(Base):
    """A keep rule: an exact key or a glob over keys and function names that prunes never delete."""

    __tablename__ = "pins"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    pattern: Mapped[str] = mapped_column(Str(512), primary_key=True)
    created_s: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(Str(128))


class PruneRow(Base):
    """One applied prune or single-entry delete, for the audit log: written with its plan before anything is
    deleted (``state`` "running"), then its outcome ("done", "failed", or "interrupted" when the replica died)."""

    __tablename__ = "prunes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cache: Mapped[str] = mapped_column(Str(64), index=True)
    at_s: Mapped[float] = mapped_column(Float)
    who: Mapped[str] = mapped_column(Str(128))
    policy: Mapped[dict] = mapped_column(JSON)
    deleted: Mapped[int] = mapped_column(Integer)
    bytes_freed: Mapped[int] = mapped_column(BigInteger)
    already_gone: Mapped[int] = mapped_column(Integer)
    changed: Mapped[int] = mapped_column(Integer)
    errors: Mapped[list] = mapped_column(JSON)
    kind: Mapped[str] = mapped_column(Str(16), default="prune", server_default="prune")  # or "delete"
    state: Mapped[str] = mapped_column(Str(16), default="done", server_default="done")
    planned: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    planned_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    ended_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class PruneItemRow(Base):
    """An object a prune planned to delete, written before it deletes any: after a crash, the objects that are
    gone among these are what it deleted."""

    __tablename__ = "prune_items"
    prune_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Str(1024), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512))
    size_bytes: Mapped[int] = mapped_column(BigInteger)

    # An evicted miss names the prune that deleted its key: found by key, not by reading every prune's plan.
    __table_args__ = (Index("ix_prune_items_key", "key"),)


class WarmupRow(Base):
    """One warm-up run, from its coverage record under ``.jaxcache/warmups/``."""

    __tablename__ = "warmups"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    id: Mapped[str] = mapped_column(Str(128), primary_key=True)
    job: Mapped[str] = mapped_column(Str(256))
    topology: Mapped[str] = mapped_column(Str(64))
    platform: Mapped[str] = mapped_column(Str(16))
    gpu_model: Mapped[str | None] = mapped_column(Str(256), nullable=True)
    started_s: Mapped[float] = mapped_column(Float)
    finished_s: Mapped[float] = mapped_column(Float)
    fingerprint: Mapped[dict] = mapped_column(JSON)
    programs: Mapped[int] = mapped_column(Integer)
    written: Mapped[int] = mapped_column(Integer)
    present: Mapped[int] = mapped_column(Integer)
    not_written: Mapped[int] = mapped_column(Integer)
    compile_s: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_warmups_finished", "cache", "finished_s"),)


class WarmupKeyRow(Base):
    """One program a warm-up compiled or found."""

    __tablename__ = "warmup_keys"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    warmup_id: Mapped[str] = mapped_column(Str(128), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512), primary_key=True)
    function: Mapped[str] = mapped_column(Str(1024))
    status: Mapped[str] = mapped_column(Str(16))
    compile_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # What explanations read of a warm-up's programs, as for usage rows: why one was not written, and its key.
    reason: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    parts: Mapped[dict | None] = mapped_column(NullableJSON, nullable=True)
    program: Mapped[dict | None] = mapped_column(NullableJSON, nullable=True)

    __table_args__ = (
        Index("ix_warmup_keys_key", "cache", "key"),
        Index("ix_warmup_keys_function", "cache", "function"),
    )


class AttestationRow(Base):
    """The unsigned digest that counts for an entry: the first the service accepted, reported or read from a file
    alike (jaxcache.attestations; signatures are read beside the entry, never stored here). Others go to
    ``attestation_conflicts``; a ``signed`` source is a row from the retired HMAC scheme, which proves nothing."""

    __tablename__ = "attestations"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512), primary_key=True)
    sha256: Mapped[str] = mapped_column(Str(64))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    writer: Mapped[str] = mapped_column(Str(512))
    at_s: Mapped[float] = mapped_column(Float)  # when the service accepted it, by its own clock
    source: Mapped[str] = mapped_column(Str(16), server_default="file")
    record: Mapped[str | None] = mapped_column(Str(1024), nullable=True)  # the record file it was read from
    platform: Mapped[str | None] = mapped_column(Str(1024), nullable=True)


class AttestationConflictRow(Base):
    """A digest of an entry that differs from the one that counts: shown, never silently taking its place."""

    __tablename__ = "attestation_conflicts"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512), primary_key=True)
    sha256: Mapped[str] = mapped_column(Str(64), primary_key=True)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    writer: Mapped[str] = mapped_column(Str(512))
    source: Mapped[str] = mapped_column(Str(16))
    record: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    seen_s: Mapped[float] = mapped_column(Float)


class VerificationRow(Base):
    """The last integrity verdict on an entry, and which version of it (size, mtime, generation) was read."""

    __tablename__ = "verifications"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512), primary_key=True)
    classification: Mapped[str] = mapped_column(Str(16))
    classes: Mapped[list] = mapped_column(JSON)
    reasons: Mapped[list] = mapped_column(JSON)
    sha256: Mapped[str | None] = mapped_column(Str(64), nullable=True)
    attested_sha256: Mapped[str | None] = mapped_column(Str(64), nullable=True)
    attested_by: Mapped[str | None] = mapped_column(Str(512), nullable=True)
    embedded_module: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_s: Mapped[float] = mapped_column(Float)
    generation: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    checked_s: Mapped[float] = mapped_column(Float)
    # The trusted keys it was judged under (TrustedKeys.digest): another set makes it a verdict to make again.
    trusted: Mapped[str | None] = mapped_column(Str(64), nullable=True)

    __table_args__ = (Index("ix_verifications_class", "cache", "classification"),)
