"""The report inbox: run records accepted and not folded into the run tables yet.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "report_inbox",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("run_id", _str(128), primary_key=True),
        sa.Column("process_index", sa.Integer, primary_key=True),
        sa.Column("updated_s", sa.Float, nullable=False),
        sa.Column("source", _str(16), nullable=False),
        sa.Column("record", _str(1024), nullable=True),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("received_s", sa.Float, nullable=False),
    )
    op.create_index("ix_report_inbox_received", "report_inbox", ["cache", "received_s"])


def downgrade() -> None:
    op.drop_index("ix_report_inbox_received", table_name="report_inbox")
    op.drop_table("report_inbox")
