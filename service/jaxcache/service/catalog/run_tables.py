"""The tables of ingested run records: ``runs``, ``process_keys``, ``usage`` (per run and key), ``key_stats`` (per
key, copied onto entry rows) and ``key_history`` (what retention folded)."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Boolean, Float, Index, Integer, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from jaxcache.service.catalog.schema import Base, NullableJSON, Str

#: A process_keys row of a process that wrote its key (jaxcache.usage_rules.wrote; spelled as the index has it).
WROTE = "writes > 0 OR event = 'write'"


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


#: The names of the aggregate columns, in their order.
AGGREGATES = tuple(Aggregates.__annotations__)


class KeyStatsRow(Aggregates, Base):
    """Aggregates of one key over every ingested run record, compacted ones included; may exist without the entry."""

    __tablename__ = "key_stats"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512), primary_key=True)

    __table_args__ = ({"postgresql_with": {"fillfactor": 80}},)  # see UsageRow


class KeyHistoryRow(Aggregates, Base):
    """Aggregates of one key over the runs compacted after the records' retention (their rows are gone)."""

    __tablename__ = "key_history"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512), primary_key=True)


class RunRow(Base):
    """One process of one run of a job, from its latest run record."""

    __tablename__ = "runs"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
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
    # The node-local tier's counts (jaxcache.records.LocalTierCounts; NULL: none): shown, never summed, so JSON.
    local: Mapped[dict | None] = mapped_column(NullableJSON, nullable=True)

    __table_args__ = (
        Index("ix_runs_job", "cache", "job", "updated_s"),
        Index("ix_runs_updated", "cache", "updated_s"),
    )


class ProcessKeysRow(Base):
    """What one process did with one key, as its latest record says: what usage rows and totals are computed from."""

    __tablename__ = "process_keys"
    # Key first: a run's usage row of a key, and a key's every row, are a range of rows in order (no sort).
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
    key: Mapped[str] = mapped_column(Str(512), primary_key=True)
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
        # SQLite stores the rows in key order: a usage row reads a range, not rows scattered over the file.
        {"sqlite_with_rowid": False},
    )


class UsageRow(Base):
    """What the processes of one run did with one key: their figures summed, or their extreme (first and last use,
    the most informative event, the earliest write); docs/service.md, "Run records"."""

    __tablename__ = "usage"
    cache: Mapped[str] = mapped_column(Str(64), primary_key=True)
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
