"""Verdicts name a bad signature beside an entry (``verifications.signature``), whatever the entry's class.

Verdicts made before it whose reasons name a signature are made again at the next pass (their ``trusted`` cleared),
so an entry already judged beside a bad signature is named too; the others are read again only as before.

Revision ID: 6
Revises: 5
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "6"
down_revision = "5"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("verifications") as batch:
        batch.add_column(sa.Column("signature", sa.String(16).with_variant(sa.String(16, collation="C"), "postgresql"),
                                   nullable=True))
    op.execute("UPDATE verifications SET trusted = NULL WHERE trusted IS NOT NULL"
               " AND CAST(reasons AS TEXT) LIKE '%signature%'")


def downgrade() -> None:
    with op.batch_alter_table("verifications") as batch:
        batch.drop_column("signature")
