"""Where each digest came from (signed, reported, a record file), and the digests that conflict with it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

A column with a default and a new table: replicas still on 0003 read and write the upgraded database. Digests
stored before this revision came by either channel; they are kept as read from a file, the lowest, so that a
signed or reported digest arriving now outranks them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("attestations") as batch:
        batch.add_column(sa.Column("source", _str(16), server_default="file", nullable=False))
        batch.add_column(sa.Column("record", _str(1024), nullable=True))
        batch.add_column(sa.Column("platform", _str(1024), nullable=True))
    op.create_table(
        "attestation_conflicts",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("key", _str(512), primary_key=True),
        sa.Column("sha256", _str(64), primary_key=True),
        sa.Column("size_bytes", sa.BigInteger, nullable=True),
        sa.Column("writer", _str(512), nullable=False),
        sa.Column("source", _str(16), nullable=False),
        sa.Column("record", _str(1024), nullable=True),
        sa.Column("seen_s", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("attestation_conflicts")
    with op.batch_alter_table("attestations") as batch:
        batch.drop_column("platform")
        batch.drop_column("record")
        batch.drop_column("source")
