"""What every process of every replica shares besides the index: change counts and loop health.

Revision ID: 2
Revises: 1
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "2"
down_revision = "1"
branch_labels = None
depends_on = None


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.schema.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "change_counts",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("entries", sa.BigInteger(), nullable=False),
        sa.Column("usage", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("cache"),
    )
    op.create_table(
        "loop_health",
        sa.Column("loop", _str(32), nullable=False),
        sa.Column("status", sa.JSON(), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("loop"),
    )


def downgrade() -> None:
    op.drop_table("loop_health")
    op.drop_table("change_counts")
