"""Each cache's statistics of its entries, kept in the catalog (``cache_stats``): computed once after each change, by
whoever made it, and read by every process of every replica, rather than by each process for itself.

Revision ID: 8
Revises: 7
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "8"
down_revision = "7"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cache_stats",
        sa.Column("cache", sa.String(64).with_variant(sa.String(64, collation="C"), "postgresql"), nullable=False),
        sa.Column("entries", sa.BigInteger(), nullable=False),
        sa.Column("computed_s", sa.Float(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("cache"),
    )


def downgrade() -> None:
    op.drop_table("cache_stats")
