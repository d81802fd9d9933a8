"""Which trusted keys each integrity verdict was made under, so that a changed JAXCACHE_TRUSTED_KEYS has every
entry judged again (a key removed makes its entries unsigned; verdicts from before say nothing of that).

Revision ID: 3
Revises: 2
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "3"
down_revision = "2"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Null for verdicts made before: judged again at the next pass.
    with op.batch_alter_table("verifications") as batch:
        batch.add_column(sa.Column("trusted", sa.String(64).with_variant(sa.String(64, collation="C"), "postgresql"),
                                   nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("verifications") as batch:
        batch.drop_column("trusted")
