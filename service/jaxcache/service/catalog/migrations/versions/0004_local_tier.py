"""What each process's node-local tier did (loaded locally, fetched on demand, uploaded, skipped as unverified,
with bytes and seconds), as its latest run record says: the job's page and API show it per process (#35).

Revision ID: 4
Revises: 3
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "4"
down_revision = "3"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Null for processes folded before, and for those without a tier: nothing to show for either.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("local", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("local")
