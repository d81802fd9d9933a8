"""What kind of process wrote a run record (job, warmup, warmup-verify): runs.kind, repeated on usage.kind.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Only columns with a server default: rows already there (and rows that replicas still on 0005 insert during a
rolling update) are jobs, as every record was before warm-ups said otherwise.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _kind() -> sa.Column:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.Column("kind", sa.String(16).with_variant(sa.String(16, collation="C"), "postgresql"),
                     nullable=False, server_default="job")


def upgrade() -> None:
    for table in ("runs", "usage"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(_kind())


def downgrade() -> None:
    for table in ("usage", "runs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("kind")
