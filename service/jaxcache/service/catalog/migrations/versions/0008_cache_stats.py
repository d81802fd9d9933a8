"""Each cache's statistics, kept in the catalog (``cache_stats``, a row per part: the entries' figures, the seconds
their hits saved) under the change counts they were computed at: computed once after a change and read by every
process of every replica, rather than by each process for itself.

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


def _str(length: int) -> sa.String:
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "cache_stats",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("part", _str(16), nullable=False),
        sa.Column("counts", _str(64), nullable=False),
        sa.Column("computed_s", sa.Float(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("cache", "part"),
    )


def downgrade() -> None:
    op.drop_table("cache_stats")
