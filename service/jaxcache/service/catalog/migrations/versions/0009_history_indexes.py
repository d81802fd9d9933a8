"""Indexes that explaining misses reads in order: a key's usage rows by first use, a function's entries by
creation.

Revision ID: 0009
Revises: 0008
Create Date: 2027-01-10

With (cache, key) alone, "the newest 200 rows of a key" read every process's row of the key and sorted them (a job
of 1,000 processes has 1,000 per key); with (cache, kind, module) alone, "the 3 oldest entries of a function" was
planned along the creation index and walked every entry of the cache when the function had none (a new program's
miss). Both now stop at their limit. Only indexes: replicas still on 0008 read and write as before.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_usage_key", table_name="usage")
    op.create_index("ix_usage_key", "usage", ["cache", "key", "first_at"])
    op.drop_index("ix_entries_module", table_name="entries")
    op.create_index("ix_entries_module", "entries", ["cache", "kind", "module", "created_s", "key"])


def downgrade() -> None:
    op.drop_index("ix_entries_module", table_name="entries")
    op.create_index("ix_entries_module", "entries", ["cache", "kind", "module"])
    op.drop_index("ix_usage_key", table_name="usage")
    op.create_index("ix_usage_key", "usage", ["cache", "key"])
