"""The catalog as it was before Alembic: caches, entries, key_stats, runs, usage, record_files, pins, prunes.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Frozen: this is the schema of revision 0001 whatever the models in catalog.py become. Its tables are built by
``tables()`` so that :mod:`jaxcache.service.catalog.migrate` can compare a pre-Alembic catalog against them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def _aggregates() -> list[sa.Column]:
    return [
        sa.Column("hits", sa.BigInteger, nullable=False),
        sa.Column("last_hit_s", sa.Float, nullable=True),
        sa.Column("saved_s", sa.Float, nullable=False),
        sa.Column("writer_job", _str(256), nullable=True),
        sa.Column("writer_run", _str(128), nullable=True),
        sa.Column("writer_process", sa.Integer, nullable=True),
        sa.Column("writer_host", _str(1024), nullable=True),
        sa.Column("writer_topology", _str(1024), nullable=True),
        sa.Column("writer_jax", _str(1024), nullable=True),
        sa.Column("writer_jaxlib", _str(1024), nullable=True),
        sa.Column("writer_at_s", sa.Float, nullable=True),
        sa.Column("writer_compile_s", sa.Float, nullable=True),
    ]


def tables(metadata: sa.MetaData) -> list[sa.Table]:
    """The tables (with their indexes) of this revision, in ``metadata``."""
    return [
        sa.Table(
            "caches", metadata,
            sa.Column("name", _str(64), primary_key=True),
            sa.Column("url", _str(1024), nullable=False),
            sa.Column("last_scan_s", sa.Float, nullable=True),
            sa.Column("last_scan_seconds", sa.Float, nullable=True),
            sa.Column("last_scan_error", _str(2048), nullable=True),
        ),
        sa.Table(
            "entries", metadata,
            sa.Column("cache", _str(64), primary_key=True),
            sa.Column("key", _str(512), primary_key=True),
            sa.Column("kind", _str(8), primary_key=True),
            sa.Column("module", _str(448), nullable=False),
            sa.Column("name", _str(512), nullable=False),
            sa.Column("size_bytes", sa.BigInteger, nullable=False),
            sa.Column("created_s", sa.Float, nullable=False),
            sa.Column("last_used_s", sa.Float, nullable=False),
            sa.Column("generation", sa.BigInteger, nullable=True),
            sa.Column("has_atime", sa.Boolean, nullable=False),
            sa.Column("atime_ns", sa.BigInteger, nullable=True),
            sa.Column("compression", _str(16), nullable=True),
            sa.Column("compile_seconds", sa.Integer, nullable=True),
            sa.Column("status", _str(16), nullable=True),
            sa.Column("reason", _str(1024), nullable=True),
            sa.Column("first_seen_s", sa.Float, nullable=False),
            sa.Column("seen_used_s", sa.Float, nullable=False),
            *_aggregates(),
            sa.Index("ix_entries_size", "cache", "kind", "size_bytes", "key"),
            sa.Index("ix_entries_last_used", "cache", "kind", "last_used_s", "key"),
            sa.Index("ix_entries_created", "cache", "kind", "created_s", "key"),
            sa.Index("ix_entries_compile", "cache", "kind", "compile_seconds", "key"),
            sa.Index("ix_entries_module", "cache", "kind", "module"),
            sa.Index("ix_entries_hits", "cache", "kind", "hits", "key"),
            sa.Index("ix_entries_writer_jaxlib", "cache", "kind", "writer_jaxlib"),
            sa.Index("ix_entries_writer_topology", "cache", "kind", "writer_topology"),
        ),
        sa.Table(
            "key_stats", metadata,
            sa.Column("cache", _str(64), primary_key=True),
            sa.Column("key", _str(512), primary_key=True),
            *_aggregates(),
        ),
        sa.Table(
            "runs", metadata,
            sa.Column("cache", _str(64), primary_key=True),
            sa.Column("run_id", _str(128), primary_key=True),
            sa.Column("process_index", sa.Integer, primary_key=True),
            sa.Column("job", _str(256), nullable=False),
            sa.Column("process_count", sa.Integer, nullable=False),
            sa.Column("host", _str(1024), nullable=False),
            sa.Column("topology", _str(1024), nullable=True),
            sa.Column("cache_dir", _str(1024), nullable=True),
            sa.Column("jax", _str(1024), nullable=False),
            sa.Column("jaxlib", _str(1024), nullable=False),
            sa.Column("backend", _str(1024), nullable=True),
            sa.Column("fingerprint", sa.JSON, nullable=False),
            sa.Column("fingerprint_digest", _str(32), nullable=False),
            sa.Column("started_s", sa.Float, nullable=False),
            sa.Column("updated_s", sa.Float, nullable=False),
            sa.Column("final", sa.Boolean, nullable=False),
            sa.Column("pid", sa.BigInteger, nullable=True),
            sa.Column("keys", sa.Integer, nullable=False),
            sa.Column("source", _str(16), nullable=False),
            sa.Column("ingested_s", sa.Float, nullable=False),
            sa.Index("ix_runs_job", "cache", "job", "updated_s"),
            sa.Index("ix_runs_updated", "cache", "updated_s"),
        ),
        sa.Table(
            "usage", metadata,
            sa.Column("cache", _str(64), primary_key=True),
            sa.Column("run_id", _str(128), primary_key=True),
            sa.Column("process_index", sa.Integer, primary_key=True),
            sa.Column("key", _str(512), primary_key=True),
            sa.Column("job", _str(256), nullable=False),
            sa.Column("function", _str(1024), nullable=False),
            sa.Column("event", _str(16), nullable=False),
            sa.Column("hits", sa.BigInteger, nullable=False),
            sa.Column("compiles", sa.BigInteger, nullable=False),
            sa.Column("writes", sa.BigInteger, nullable=False),
            sa.Column("reason", _str(1024), nullable=True),
            sa.Column("compile_s", sa.Float, nullable=True),
            sa.Column("retrieval_s", sa.Float, nullable=False),
            sa.Column("jax_saved_s", sa.Float, nullable=False),
            sa.Column("saved_s", sa.Float, nullable=False),
            sa.Column("size_bytes", sa.BigInteger, nullable=True),
            sa.Column("first_at", sa.Float, nullable=False),
            sa.Column("last_at", sa.Float, nullable=False),
            sa.Index("ix_usage_key", "cache", "key"),
            sa.Index("ix_usage_job", "cache", "job", "key"),
        ),
        sa.Table(
            "record_files", metadata,
            sa.Column("cache", _str(64), primary_key=True),
            sa.Column("name", _str(1024), primary_key=True),
            sa.Column("size_bytes", sa.BigInteger, nullable=False),
            sa.Column("mtime_s", sa.Float, nullable=False),
            sa.Column("generation", sa.BigInteger, nullable=True),
            sa.Column("error", _str(2048), nullable=True),
        ),
        sa.Table(
            "pins", metadata,
            sa.Column("cache", _str(64), primary_key=True),
            sa.Column("pattern", _str(512), primary_key=True),
            sa.Column("created_s", sa.Float, nullable=False),
            sa.Column("created_by", _str(128), nullable=False),
        ),
        sa.Table(
            "prunes", metadata,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("cache", _str(64), nullable=False),
            sa.Column("at_s", sa.Float, nullable=False),
            sa.Column("who", _str(128), nullable=False),
            sa.Column("policy", sa.JSON, nullable=False),
            sa.Column("deleted", sa.Integer, nullable=False),
            sa.Column("bytes_freed", sa.BigInteger, nullable=False),
            sa.Column("already_gone", sa.Integer, nullable=False),
            sa.Column("changed", sa.Integer, nullable=False),
            sa.Column("errors", sa.JSON, nullable=False),
            sa.Index("ix_prunes_cache", "cache"),
        ),
    ]


def upgrade() -> None:
    metadata = sa.MetaData()
    tables(metadata)
    metadata.create_all(op.get_bind())


def downgrade() -> None:
    metadata = sa.MetaData()
    tables(metadata)
    metadata.drop_all(op.get_bind())
