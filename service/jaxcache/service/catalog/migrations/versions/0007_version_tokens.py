"""An object's version is a token each store defines (``version``, text), no longer GCS's generation (an integer).

``generation`` becomes ``version`` in entries, record_files and verifications: a GCS generation is kept as its
decimal text, which is what the service now reads from a listing, so nothing is read again. Going back keeps the
versions that are whole numbers (GCS's) and clears the others (S3 and Azure ETags), which that schema cannot hold.

A column added, filled and the old one dropped, on both backends: SQLite's batch mode would rebuild the tables and
lose the entries' expression index (ix_entries_compile_sort), which it cannot reflect.

Revision ID: 7
Revises: 6
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "7"
down_revision = "6"
branch_labels = None
depends_on = None

_TABLES = ("entries", "record_files", "verifications")
_VERSION_MAX = 256  # models.VERSION_MAX when this revision was written


def _str(length: int) -> sa.String:
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("version", _str(_VERSION_MAX), nullable=True))
        op.execute(f"UPDATE {table} SET version = CAST(generation AS VARCHAR({_VERSION_MAX}))"
                   " WHERE generation IS NOT NULL")
        op.drop_column(table, "generation")


def downgrade() -> None:
    # A version that is not a whole number (an ETag) has no generation: NULL, not a cast's error (PostgreSQL) or 0
    # (SQLite). 18 digits at most: within BIGINT (GCS's generations have 16).
    digits_only = "btrim" if op.get_bind().dialect.name == "postgresql" else "trim"
    for table in _TABLES:
        op.add_column(table, sa.Column("generation", sa.BigInteger(), nullable=True))
        op.execute(f"UPDATE {table} SET generation = CAST(version AS BIGINT) WHERE version IS NOT NULL AND"
                   f" version <> '' AND LENGTH(version) <= 18 AND {digits_only}(version, '0123456789') = ''")
        op.drop_column(table, "version")
