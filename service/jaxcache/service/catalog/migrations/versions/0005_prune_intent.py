"""Prunes are audited before they delete: their state and plan in ``prunes``, their planned objects in
``prune_items``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Columns with defaults and a new table: replicas still on 0004 go on writing finished prunes as before (their rows
read "done"). Prunes audited before this revision keep their counts; their plans were not recorded.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("prunes") as batch:
        batch.add_column(sa.Column("kind", _str(16), server_default="prune", nullable=False))
        batch.add_column(sa.Column("state", _str(16), server_default="done", nullable=False))
        batch.add_column(sa.Column("planned", sa.Integer, server_default="0", nullable=False))
        batch.add_column(sa.Column("planned_bytes", sa.BigInteger, server_default="0", nullable=False))
        batch.add_column(sa.Column("ended_s", sa.Float, nullable=True))
    op.create_table(
        "prune_items",
        sa.Column("prune_id", sa.Integer, primary_key=True),
        sa.Column("name", _str(1024), primary_key=True),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("prune_items")
    with op.batch_alter_table("prunes") as batch:
        for column in ("ended_s", "planned_bytes", "planned", "state", "kind"):
            batch.drop_column(column)
