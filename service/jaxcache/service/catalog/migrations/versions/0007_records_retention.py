"""Run records' retention: per-key aggregates of compacted runs (``key_history``), each cache's compaction
watermark (``caches.compacted_before_s``), and an index of record files by modification time.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08

Only a new table, a nullable column and an index: replicas still on 0006 go on reading and writing as before (they
do not compact, and their key_stats recomputations leave compacted history out until a replica on 0007 recomputes
those keys).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "key_history",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("key", _str(512), primary_key=True),
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
    )
    with op.batch_alter_table("caches") as batch:
        batch.add_column(sa.Column("compacted_before_s", sa.Float, nullable=True))
    op.create_index("ix_record_files_mtime", "record_files", ["cache", "mtime_s"])


def downgrade() -> None:
    op.drop_index("ix_record_files_mtime", table_name="record_files")
    with op.batch_alter_table("caches") as batch:
        batch.drop_column("compacted_before_s")
    op.drop_table("key_history")
