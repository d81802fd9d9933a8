"""Seconds saved by the platform's own compile time: each key's first job compile (``platform_compile_s``, its machine
and time) and the first writer's machine (``writer_machine``) beside the other aggregates, in ``key_stats``,
``key_history`` and ``entries``; each process's machine and the part of its seconds saved credited at the writer's
time (``runs.machine``, ``runs.saved_writer_s``); a partial index of the processes that compiled and measured a key.
Only adds: rows already there read as "no job measured it yet",
and take their platform's measure as the next records of their keys are folded.

Revision ID: 9
Revises: 8
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "9"
down_revision = "8"
branch_labels = None
depends_on = None

_AGGREGATED = ("key_stats", "key_history", "entries")
_MEASURED = "compiles > 0 AND compile_s IS NOT NULL"


def _str(length: int) -> sa.String:
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    for table in _AGGREGATED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("writer_machine", _str(1024), nullable=True))
            batch.add_column(sa.Column("platform_compile_s", sa.Float(), nullable=True))
            batch.add_column(sa.Column("platform_machine", _str(1024), nullable=True))
            batch.add_column(sa.Column("platform_at_s", sa.Float(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("saved_writer_s", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("machine", _str(1024), nullable=True))
    op.create_index("ix_process_keys_measured", "process_keys", ["cache", "key"], sqlite_where=sa.text(_MEASURED),
                    postgresql_where=sa.text(_MEASURED))


def downgrade() -> None:
    op.drop_index("ix_process_keys_measured", table_name="process_keys")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("machine")
        batch.drop_column("saved_writer_s")
    for table in _AGGREGATED:
        with op.batch_alter_table(table) as batch:
            for column in ("platform_at_s", "platform_machine", "platform_compile_s", "writer_machine"):
                batch.drop_column(column)
