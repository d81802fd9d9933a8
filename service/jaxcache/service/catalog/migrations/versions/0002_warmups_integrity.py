"""Warm-up coverage (warmups, warmup_keys) and entry integrity (attestations, verifications).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Only new tables: replicas still on 0001 read and write the upgraded database as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "warmups",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("id", _str(128), primary_key=True),
        sa.Column("job", _str(256), nullable=False),
        sa.Column("topology", _str(64), nullable=False),
        sa.Column("platform", _str(16), nullable=False),
        sa.Column("gpu_model", _str(256), nullable=True),
        sa.Column("started_s", sa.Float, nullable=False),
        sa.Column("finished_s", sa.Float, nullable=False),
        sa.Column("fingerprint", sa.JSON, nullable=False),
        sa.Column("programs", sa.Integer, nullable=False),
        sa.Column("written", sa.Integer, nullable=False),
        sa.Column("present", sa.Integer, nullable=False),
        sa.Column("not_written", sa.Integer, nullable=False),
        sa.Column("compile_s", sa.Float, nullable=False),
    )
    op.create_index("ix_warmups_finished", "warmups", ["cache", "finished_s"])
    op.create_table(
        "warmup_keys",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("warmup_id", _str(128), primary_key=True),
        sa.Column("key", _str(512), primary_key=True),
        sa.Column("function", _str(1024), nullable=False),
        sa.Column("status", _str(16), nullable=False),
        sa.Column("compile_s", sa.Float, nullable=True),
        sa.Column("size_bytes", sa.BigInteger, nullable=True),
    )
    op.create_table(
        "attestations",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("key", _str(512), primary_key=True),
        sa.Column("sha256", _str(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=True),
        sa.Column("writer", _str(512), nullable=False),
        sa.Column("at_s", sa.Float, nullable=False),
    )
    op.create_table(
        "verifications",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("key", _str(512), primary_key=True),
        sa.Column("classification", _str(16), nullable=False),
        sa.Column("classes", sa.JSON, nullable=False),
        sa.Column("reasons", sa.JSON, nullable=False),
        sa.Column("sha256", _str(64), nullable=True),
        sa.Column("attested_sha256", _str(64), nullable=True),
        sa.Column("attested_by", _str(512), nullable=True),
        sa.Column("embedded_module", _str(1024), nullable=True),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("created_s", sa.Float, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=True),
        sa.Column("checked_s", sa.Float, nullable=False),
    )
    op.create_index("ix_verifications_class", "verifications", ["cache", "classification"])


def downgrade() -> None:
    op.drop_index("ix_verifications_class", "verifications")
    op.drop_table("verifications")
    op.drop_table("attestations")
    op.drop_table("warmup_keys")
    op.drop_index("ix_warmups_finished", "warmups")
    op.drop_table("warmups")
