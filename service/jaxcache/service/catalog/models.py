"""The catalog's tables: an index of every cache root's entries (rebuilt from storage by a rescan), and what only
the catalog holds: pins, the prune audit log, ingested run records (``runs``, ``process_keys``, ``usage``, and each
key's aggregates in ``key_stats`` and ``key_history``), warm-up records, writers' digests, verdicts. The schema is
owned by the Alembic revisions in ``migrations/``: a model changed here needs a revision there (a test compares the
two).
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Python None as SQL NULL, not JSON ``null``, so "no parts recorded" is visible to ``IS NULL`` and indexes.
NullableJSON = JSON(none_as_null=True)
#: Characters of an object's version token kept (storage.ObjectInfo.version: a GCS generation has 16-20 digits, an
#: S3 or Azure ETag about 20-50 characters with its quotes).
VERSION_MAX = 256


def Str(length: int) -> String:
    """A string column ordered by code point on every backend (PostgreSQL: collation "C"), as keyset cursors need."""
    return String(length).with_variant(String(length, collation="C"), "postgresql")


class Base(DeclarativeBase):
    pass


def table_of(model: type[Base]) -> Table:
    """A model's ``__table__`` typed as the Table it is here, for Core statements such as ``update()``."""
    return cast(Table, model.__table__)


def max_length(column: ColumnElement[Any]) -> int:
    """The length of a ``Str`` column: longer values would not fit."""
    kind = column.type
    if not isinstance(kind, String) or kind.length is None:
        raise TypeError(f"{column} is not a string column of bounded length")
    return kind.length


class PerCache:
    """A row of one cache: ``cache`` leads its columns and primary key (``sort_order``: a mixin's come last else)."""

    cache: Mapped[str] = mapped_column(Str(64), primary_key=True, sort_order=-2)


class PerKey(PerCache):
    """A row of one key of a cache: ``(cache, key)`` lead its columns and primary key."""

    key: Mapped[str] = mapped_column(Str(512), primary_key=True, sort_order=-1)


# --- ingested run records --------------------------------------------------------------------------------------------

#: A process_keys row of a process that wrote its key (jaxcache.usage_rules.wrote; spelled as the index has it).
WROTE = "writes > 0 OR event = 'write'"
#: A process_keys row of a process that compiled its key and measured it: a platform's measure, if a job's.
MEASURED = "compiles > 0 AND compile_s IS NOT NULL"


class Aggregates:
    """The per-key aggregate columns of key_stats, key_history and the entry rows that copy them."""

    hits: Mapped[int] = mapped_column(BigInteger, default=0)
    last_hit_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    saved_s: Mapped[float] = mapped_column(Float, default=0.0)
    # The first writer: the process with the earliest `write` event for the key.
    writer_job: Mapped[str | None] = mapped_column(Str(256), nullable=True)
    writer_run: Mapped[str | None] = mapped_column(Str(128), nullable=True)
    writer_process: Mapped[int | None] = mapped_column(Integer, nullable=True)
    writer_host: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    writer_topology: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    writer_jax: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    writer_jaxlib: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    writer_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    writer_compile_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    writer_machine: Mapped[str | None] = mapped_column(Str(1024), nullable=True)  # jaxcache.records.machine_of
    # The key's platform's own measure: the first job process that compiled it (a key names its platform, so every
    # job that compiles it does so on that device kind), with its machine and when; what a hit is credited with
    # before its first writer's measure (jaxcache.usage_rules.credited_measure).
    platform_compile_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    platform_machine: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    platform_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)


#: The names of the aggregate columns, in their order.
AGGREGATES = tuple(Aggregates.__annotations__)
#: A key's aggregates when no run record mentions it: a rescan's new rows and a changed root's start there.
EMPTY: dict[str, Any] = {name: None for name in AGGREGATES} | {"hits": 0, "saved_s": 0.0}


class KeyStatsRow(PerKey, Aggregates, Base):
    """Aggregates of one key over every ingested run record, compacted ones included; may exist without the entry."""

    __tablename__ = "key_stats"

    __table_args__ = ({"postgresql_with": {"fillfactor": 80}},)  # see UsageRow


class KeyHistoryRow(PerKey, Aggregates, Base):
    """Aggregates of one key over the runs compacted after the records' retention (their rows are gone)."""

    __tablename__ = "key_history"


class RunRow(PerCache, Base):
    """One process of one run of a job, from its latest run record."""

    __tablename__ = "runs"
    run_id: Mapped[str] = mapped_column(Str(128), primary_key=True)
    process_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    job: Mapped[str] = mapped_column(Str(256))
    process_count: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(Str(1024))
    topology: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    cache_dir: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    jax: Mapped[str] = mapped_column(Str(1024))
    jaxlib: Mapped[str] = mapped_column(Str(1024))
    backend: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    fingerprint: Mapped[dict] = mapped_column(JSON)
    fingerprint_digest: Mapped[str] = mapped_column(Str(32))
    started_s: Mapped[float] = mapped_column(Float)
    updated_s: Mapped[float] = mapped_column(Float)
    final: Mapped[bool] = mapped_column(Boolean, default=False)
    pid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    keys: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str] = mapped_column(Str(16))  # "report" (POST) or "storage" (a rescan read the file)
    # What wrote the record (jaxcache.records.RunKind): only jobs count in jobs' figures and hit aggregates.
    kind: Mapped[str] = mapped_column(Str(16), default="job", server_default="job")
    ingested_s: Mapped[float] = mapped_column(Float)
    # The process's own totals over its keys: per-process figures without reading its process_keys rows.
    hits: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    compiles: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    writes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    saved_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # Of saved_s, the seconds credited at the writer's time: hits of keys no job's compile measured.
    saved_writer_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # Where the process compiled (jaxcache.records.machine_of its fingerprint and CPUs); NULL: its record says neither.
    machine: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    # The node-local tier's counts (jaxcache.records.LocalTierCounts; NULL: none): shown, never summed, so JSON.
    local: Mapped[dict | None] = mapped_column(NullableJSON, nullable=True)

    __table_args__ = (
        Index("ix_runs_job", "cache", "job", "updated_s"),
        Index("ix_runs_updated", "cache", "updated_s"),
    )


class ProcessKeysRow(PerKey, Base):
    """What one process did with one key, as its latest record says: what usage rows and totals are computed from."""

    __tablename__ = "process_keys"
    # After the key: a run's usage row of a key, and a key's every row, are a range of rows in order (no sort).
    run_id: Mapped[str] = mapped_column(Str(128), primary_key=True)
    process_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    function: Mapped[str] = mapped_column(Str(1024))
    event: Mapped[str] = mapped_column(Str(16))
    hits: Mapped[int] = mapped_column(BigInteger, default=0)
    compiles: Mapped[int] = mapped_column(BigInteger, default=0)
    writes: Mapped[int] = mapped_column(BigInteger, default=0)
    reason: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    compile_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    retrieval_s: Mapped[float] = mapped_column(Float, default=0.0)
    jax_saved_s: Mapped[float] = mapped_column(Float, default=0.0)  # the record's saved_s (JAX's own figure)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    first_at: Mapped[float] = mapped_column(Float, default=0.0)
    last_at: Mapped[float] = mapped_column(Float, default=0.0)

    __table_args__ = (
        # A process's rows: what its next record replaces, and what retention folds.
        Index("ix_process_keys_process", "cache", "run_id", "process_index"),
        # The rows of processes that wrote the key, over every run: where its first writer is found.
        Index("ix_process_keys_writes", "cache", "key", sqlite_where=text(WROTE), postgresql_where=text(WROTE)),
        # The rows of processes that compiled and measured the key: where its platform's measure is found, without
        # reading the rows of every process that hit it.
        Index("ix_process_keys_measured", "cache", "key", sqlite_where=text(MEASURED),
              postgresql_where=text(MEASURED)),
        # SQLite stores the rows in key order: a usage row reads a range, not rows scattered over the file.
        {"sqlite_with_rowid": False},
    )


class UsageRow(PerCache, Base):
    """What the processes of one run did with one key: their figures summed, or their extreme (first and last use,
    the most informative event, the earliest write); docs/service.md, "Run records"."""

    __tablename__ = "usage"
    run_id: Mapped[str] = mapped_column(Str(128), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512), primary_key=True)
    job: Mapped[str] = mapped_column(Str(256), primary_key=True)  # the processes' run's: per-job sums never join
    kind: Mapped[str] = mapped_column(Str(16), primary_key=True)  # theirs too, for that
    # The lowest index among the processes: the run row whose fingerprint, topology and start describe the row.
    process_index: Mapped[int] = mapped_column(Integer)
    processes: Mapped[int] = mapped_column(Integer)
    function: Mapped[str] = mapped_column(Str(1024))
    event: Mapped[str] = mapped_column(Str(16))  # the most informative of the processes': write > compiled > hit
    hits: Mapped[int] = mapped_column(BigInteger, default=0)
    compiles: Mapped[int] = mapped_column(BigInteger, default=0)
    writes: Mapped[int] = mapped_column(BigInteger, default=0)
    reason: Mapped[str | None] = mapped_column(Str(1024), nullable=True)  # the greatest of the processes'
    compile_s: Mapped[float] = mapped_column(Float, default=0.0)
    retrieval_s: Mapped[float] = mapped_column(Float, default=0.0)
    jax_saved_s: Mapped[float] = mapped_column(Float, default=0.0)  # the records' saved_s (JAX's own figure)
    saved_s: Mapped[float] = mapped_column(Float, default=0.0)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    first_at: Mapped[float] = mapped_column(Float, default=0.0)  # the earliest known (0: none known)
    last_at: Mapped[float] = mapped_column(Float, default=0.0)
    last_hit_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # the last hit that counts as use
    updated_s: Mapped[float] = mapped_column(Float)  # the newest of the processes' records
    # Processes whose row is a miss, and how many of them jaxcache_misses_total counted.
    missed: Mapped[int] = mapped_column(Integer, default=0)
    counted: Mapped[int] = mapped_column(Integer, default=0)
    # What entered the key (jaxcache.keyparts), as a record carried them: what explanations compare.
    parts: Mapped[dict | None] = mapped_column(NullableJSON, nullable=True)
    program: Mapped[dict | None] = mapped_column(NullableJSON, nullable=True)
    # The run's miss of the key, explained at ingestion (jaxcache.explain); NULL: not explained yet, or not a miss.
    cause: Mapped[str | None] = mapped_column(Str(32), nullable=True)
    differs: Mapped[list | None] = mapped_column(NullableJSON, nullable=True)  # [{part, mine, theirs, changes}]
    nearest: Mapped[str | None] = mapped_column(Str(512), nullable=True)
    fix: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (
        Index("ix_usage_key", "cache", "key", "first_at"),
        Index("ix_usage_job", "cache", "job", "key"),
        # A function's keys, newest first: explanations find a miss's nearest key without reading all its history.
        Index("ix_usage_function", "cache", "function", "first_at"),
        # Room on each page for a row's next version: updates leaving indexed columns alone stay HOT (PostgreSQL).
        {"postgresql_with": {"fillfactor": 80}},
    )


# --- entries, caches and what only the catalog holds -----------------------------------------------------------------


#: Skipped names a cache's row keeps (the count is whole): rescans write them, the API shows them; ``jaxcache doctor``
#: lists them all.
SKIPPED_SHOWN = 20


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
    # JSON: a local name that is not UTF-8 holds surrogates): the first SKIPPED_SHOWN by name,
    # each {"name", "why"}.
    last_scan_skipped: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_scan_skipped_names: Mapped[list | None] = mapped_column(NullableJSON, nullable=True)
    # Runs last updated before this were compacted into key_history: a record older than it changes nothing.
    compacted_before_s: Mapped[float | None] = mapped_column(Float, nullable=True)


#: The expression listings sort compile seconds by (see ix_entries_compile_sort; migration 0003 spells it too).
COMPILE_SORT_SQL = "coalesce(compile_seconds, -1)"


class EntryRow(PerKey, Aggregates, Base):
    """One ``-cache`` file (kind ``entry``) or one orphaned ``-atime`` file (kind ``orphan``), with its key's
    aggregates copied from key_stats whenever either side changes."""

    __tablename__ = "entries"
    kind: Mapped[str] = mapped_column(Str(8), primary_key=True)
    module: Mapped[str] = mapped_column(Str(448))
    name: Mapped[str] = mapped_column(Str(512))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_s: Mapped[float] = mapped_column(Float)
    # Derived (newest of -atime and creation) but stored: it is what lists sort and prunes select on.
    last_used_s: Mapped[float] = mapped_column(Float)
    version: Mapped[str | None] = mapped_column(Str(VERSION_MAX), nullable=True)  # storage.ObjectInfo.version
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


class RecordFileRow(PerCache, Base):
    """A run record object a rescan has read: it is parsed again only when it changes."""

    __tablename__ = "record_files"
    name: Mapped[str] = mapped_column(Str(1024), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    mtime_s: Mapped[float] = mapped_column(Float)
    version: Mapped[str | None] = mapped_column(Str(VERSION_MAX), nullable=True)  # storage.ObjectInfo.version
    error: Mapped[str | None] = mapped_column(Str(2048), nullable=True)

    # Retention finds the files older than its horizon without reading every row.
    __table_args__ = (Index("ix_record_files_mtime", "cache", "mtime_s"),)


class InboxRow(PerCache, Base):
    """A run record accepted and not folded yet (``reports/ingest/queue.py``): the newest version of one process's
    record, the JSON it came as, zstd-compressed. The drain folds it into the run tables and deletes it."""

    __tablename__ = "report_inbox"
    run_id: Mapped[str] = mapped_column(Str(128), primary_key=True)
    process_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    updated_s: Mapped[float] = mapped_column(Float)  # the record's updated_at: a newer version replaces it
    source: Mapped[str] = mapped_column(Str(16))  # "report" (POSTed) or "storage" (a rescan read its file)
    record: Mapped[str | None] = mapped_column(Str(1024), nullable=True)  # the record file it was read from
    body: Mapped[bytes] = mapped_column(LargeBinary)
    received_s: Mapped[float] = mapped_column(Float)

    # The drain takes a cache's rows oldest first.
    __table_args__ = (Index("ix_report_inbox_received", "cache", "received_s"),)


class ChangeCountRow(PerCache, Base):
    """How many times a cache's entries and its usage figures have changed (``catalog/database.py``): what
    every process of every replica checks its cached statistics and the listings' ``ETag`` against."""

    __tablename__ = "change_counts"
    entries: Mapped[int] = mapped_column(BigInteger)
    usage: Mapped[int] = mapped_column(BigInteger)


class CacheStatsRow(PerCache, Base):
    """A part of a cache's statistics (``caches/summary.py``), computed once after a change, for every process of
    every replica; ``counts``: the change counts it was computed at, as far as it depends on them."""

    __tablename__ = "cache_stats"
    part: Mapped[str] = mapped_column(Str(16), primary_key=True)
    counts: Mapped[str] = mapped_column(Str(64))
    computed_s: Mapped[float] = mapped_column(Float)
    stats: Mapped[dict] = mapped_column(JSON)


class LoopHealthRow(Base):
    """How one background loop is doing, as the process running its passes last said (``background.py``'s
    ``LoopStatus`` as JSON): any process's ``/readyz`` and ``/metrics`` show every loop."""

    __tablename__ = "loop_health"
    loop: Mapped[str] = mapped_column(Str(32), primary_key=True)
    status: Mapped[dict] = mapped_column(JSON)
    updated_s: Mapped[float] = mapped_column(Float)


class PinRow(PerCache, Base):
    """A keep rule: an exact key or a glob over keys and function names that prunes never delete."""

    __tablename__ = "pins"
    pattern: Mapped[str] = mapped_column(Str(512), primary_key=True)
    created_s: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(Str(128))


#: A prune's states (PruneRow.state): the prune writes them, the drain and retention read them (a running prune's
#: deletions are not history yet).
RUNNING, DONE, FAILED, INTERRUPTED = "running", "done", "failed", "interrupted"


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


class WarmupRow(PerCache, Base):
    """One warm-up run, from its coverage record under ``.jaxcache/warmups/``."""

    __tablename__ = "warmups"
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


class WarmupKeyRow(PerCache, Base):
    """One program a warm-up compiled or found."""

    __tablename__ = "warmup_keys"
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


class AttestationRow(PerKey, Base):
    """The unsigned digest that counts for an entry: the first the service accepted, reported or read from a file
    alike (jaxcache.attestations; signatures are read beside the entry, never stored here). Others go to
    ``attestation_conflicts``; a ``signed`` source is a row from the retired HMAC scheme, which proves nothing."""

    __tablename__ = "attestations"
    sha256: Mapped[str] = mapped_column(Str(64))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    writer: Mapped[str] = mapped_column(Str(512))
    at_s: Mapped[float] = mapped_column(Float)  # when the service accepted it, by its own clock
    source: Mapped[str] = mapped_column(Str(16), server_default="file")
    record: Mapped[str | None] = mapped_column(Str(1024), nullable=True)  # the record file it was read from
    platform: Mapped[str | None] = mapped_column(Str(1024), nullable=True)


class AttestationConflictRow(PerKey, Base):
    """A digest of an entry that differs from the one that counts: shown, never silently taking its place."""

    __tablename__ = "attestation_conflicts"
    sha256: Mapped[str] = mapped_column(Str(64), primary_key=True)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    writer: Mapped[str] = mapped_column(Str(512))
    source: Mapped[str] = mapped_column(Str(16))
    record: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    seen_s: Mapped[float] = mapped_column(Float)


class VerificationRow(PerKey, Base):
    """The last integrity verdict on an entry, and which version of it (size, mtime, version token) was read."""

    __tablename__ = "verifications"
    classification: Mapped[str] = mapped_column(Str(16))
    classes: Mapped[list] = mapped_column(JSON)
    reasons: Mapped[list] = mapped_column(JSON)
    sha256: Mapped[str | None] = mapped_column(Str(64), nullable=True)
    attested_sha256: Mapped[str | None] = mapped_column(Str(64), nullable=True)
    attested_by: Mapped[str | None] = mapped_column(Str(512), nullable=True)
    embedded_module: Mapped[str | None] = mapped_column(Str(1024), nullable=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_s: Mapped[float] = mapped_column(Float)
    version: Mapped[str | None] = mapped_column(Str(VERSION_MAX), nullable=True)  # storage.ObjectInfo.version
    checked_s: Mapped[float] = mapped_column(Float)
    # The trusted keys it was judged under (TrustedKeys.digest): another set makes it a verdict to make again.
    trusted: Mapped[str | None] = mapped_column(Str(64), nullable=True)
    # "bad signature" when a signature beside the entry is malformed, for another key, or does not verify: it proves
    # nothing and the class stays what the bytes prove, but the integrity view names it (integrity.Verdict.signature).
    signature: Mapped[str | None] = mapped_column(Str(16), nullable=True)

    __table_args__ = (Index("ix_verifications_class", "cache", "classification"),)
