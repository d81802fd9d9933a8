"""Index listings by compile seconds as they sort (unknown as -1), replacing the plain column index.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Only an index changes: replicas still on 0002 read and write the upgraded database as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# catalog.COMPILE_SORT_SQL, spelled here as it was when this revision was written.
_EXPR = "coalesce(compile_seconds, -1)"


def upgrade() -> None:
    op.drop_index("ix_entries_compile", table_name="entries")
    op.create_index("ix_entries_compile_sort", "entries", ["cache", "kind", sa.text(_EXPR), "key"])


def downgrade() -> None:
    op.drop_index("ix_entries_compile_sort", table_name="entries")
    op.create_index("ix_entries_compile", "entries", ["cache", "kind", "compile_seconds", "key"])
