"""Explained misses: each usage row keeps its key's parts and program, a job's miss its cause, what differs, the
nearest key and the fix; warm-up programs keep their parts, program and reason; indexes by function and by key.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-15

Only nullable columns and indexes: replicas still on 0007 go on ingesting as before (their rows carry no parts and
their misses no cause, which the API shows as not explained); rows already there stay unexplained likewise.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.add_column(sa.Column("parts", sa.JSON, nullable=True))
        batch.add_column(sa.Column("program", sa.JSON, nullable=True))
        batch.add_column(sa.Column("cause", _str(32), nullable=True))
        batch.add_column(sa.Column("differs", sa.JSON, nullable=True))
        batch.add_column(sa.Column("nearest", _str(512), nullable=True))
        batch.add_column(sa.Column("fix", sa.Text, nullable=True))
    with op.batch_alter_table("warmup_keys") as batch:
        batch.add_column(sa.Column("reason", _str(1024), nullable=True))
        batch.add_column(sa.Column("parts", sa.JSON, nullable=True))
        batch.add_column(sa.Column("program", sa.JSON, nullable=True))
    op.create_index("ix_usage_function", "usage", ["cache", "function", "first_at"])
    op.create_index("ix_warmup_keys_key", "warmup_keys", ["cache", "key"])
    op.create_index("ix_warmup_keys_function", "warmup_keys", ["cache", "function"])
    op.create_index("ix_prune_items_key", "prune_items", ["key"])


def downgrade() -> None:
    op.drop_index("ix_prune_items_key", table_name="prune_items")
    op.drop_index("ix_warmup_keys_function", table_name="warmup_keys")
    op.drop_index("ix_warmup_keys_key", table_name="warmup_keys")
    op.drop_index("ix_usage_function", table_name="usage")
    with op.batch_alter_table("warmup_keys") as batch:
        for column in ("program", "parts", "reason"):
            batch.drop_column(column)
    with op.batch_alter_table("usage") as batch:
        for column in ("fix", "nearest", "differs", "cause", "program", "parts"):
            batch.drop_column(column)
