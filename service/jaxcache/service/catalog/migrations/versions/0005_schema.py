"""The catalog's schema. Revisions 1 to 4 were its history before it became this one revision (catalogs at them are
refused with what to do, as those of revisions 0001 to 0011 are: catalog.migrate).

Revision ID: 5
Revises:
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "5"
down_revision = None
branch_labels = None
depends_on = None

#: catalog.models.COMPILE_SORT_SQL, spelled here as it was when this revision was written.
_COMPILE_SORT = "coalesce(compile_seconds, -1)"
#: catalog.models.WROTE, likewise.
_WROTE = "writes > 0 OR event = 'write'"


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def _key_aggregates() -> list[sa.schema.SchemaItem]:
    """The columns of key_stats and key_history: a key's aggregates."""
    return [
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.Column("last_hit_s", sa.Float(), nullable=True),
        sa.Column("saved_s", sa.Float(), nullable=False),
        sa.Column("writer_job", _str(256), nullable=True),
        sa.Column("writer_run", _str(128), nullable=True),
        sa.Column("writer_process", sa.Integer(), nullable=True),
        sa.Column("writer_host", _str(1024), nullable=True),
        sa.Column("writer_topology", _str(1024), nullable=True),
        sa.Column("writer_jax", _str(1024), nullable=True),
        sa.Column("writer_jaxlib", _str(1024), nullable=True),
        sa.Column("writer_at_s", sa.Float(), nullable=True),
        sa.Column("writer_compile_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("cache", "key"),
    ]


def upgrade() -> None:
    op.create_table(
        "attestation_conflicts",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("sha256", _str(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("writer", _str(512), nullable=False),
        sa.Column("source", _str(16), nullable=False),
        sa.Column("record", _str(1024), nullable=True),
        sa.Column("seen_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("cache", "key", "sha256"),
    )
    op.create_table(
        "attestations",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("sha256", _str(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("writer", _str(512), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("source", _str(16), server_default="file", nullable=False),
        sa.Column("record", _str(1024), nullable=True),
        sa.Column("platform", _str(1024), nullable=True),
        sa.PrimaryKeyConstraint("cache", "key"),
    )
    op.create_table(
        "caches",
        sa.Column("name", _str(64), nullable=False),
        sa.Column("url", _str(1024), nullable=False),
        sa.Column("last_scan_s", sa.Float(), nullable=True),
        sa.Column("last_scan_seconds", sa.Float(), nullable=True),
        sa.Column("last_scan_error", _str(2048), nullable=True),
        sa.Column("last_scan_skipped", sa.Integer(), nullable=True),
        sa.Column("last_scan_skipped_names", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("compacted_before_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "entries",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("kind", _str(8), nullable=False),
        sa.Column("module", _str(448), nullable=False),
        sa.Column("name", _str(512), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("last_used_s", sa.Float(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=True),
        sa.Column("has_atime", sa.Boolean(), nullable=False),
        sa.Column("atime_ns", sa.BigInteger(), nullable=True),
        sa.Column("compression", _str(16), nullable=True),
        sa.Column("compile_seconds", sa.Integer(), nullable=True),
        sa.Column("status", _str(16), nullable=True),
        sa.Column("reason", _str(1024), nullable=True),
        sa.Column("first_seen_s", sa.Float(), nullable=False),
        sa.Column("seen_used_s", sa.Float(), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.Column("last_hit_s", sa.Float(), nullable=True),
        sa.Column("saved_s", sa.Float(), nullable=False),
        sa.Column("writer_job", _str(256), nullable=True),
        sa.Column("writer_run", _str(128), nullable=True),
        sa.Column("writer_process", sa.Integer(), nullable=True),
        sa.Column("writer_host", _str(1024), nullable=True),
        sa.Column("writer_topology", _str(1024), nullable=True),
        sa.Column("writer_jax", _str(1024), nullable=True),
        sa.Column("writer_jaxlib", _str(1024), nullable=True),
        sa.Column("writer_at_s", sa.Float(), nullable=True),
        sa.Column("writer_compile_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("cache", "key", "kind"),
    )
    op.create_index("ix_entries_compile_sort", "entries", ["cache", "kind", sa.text(_COMPILE_SORT), "key"])
    op.create_index("ix_entries_created", "entries", ["cache", "kind", "created_s", "key"])
    op.create_index("ix_entries_hits", "entries", ["cache", "kind", "hits", "key"])
    op.create_index("ix_entries_last_used", "entries", ["cache", "kind", "last_used_s", "key"])
    op.create_index("ix_entries_module", "entries", ["cache", "kind", "module", "created_s", "key"])
    op.create_index("ix_entries_size", "entries", ["cache", "kind", "size_bytes", "key"])
    op.create_index("ix_entries_writer_jaxlib", "entries", ["cache", "kind", "writer_jaxlib"])
    op.create_index("ix_entries_writer_topology", "entries", ["cache", "kind", "writer_topology"])

    op.create_table("key_history", *_key_aggregates())
    op.create_table("key_stats", *_key_aggregates(), postgresql_with={"fillfactor": 80})
    op.create_table(
        "pins",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("pattern", _str(512), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("created_by", _str(128), nullable=False),
        sa.PrimaryKeyConstraint("cache", "pattern"),
    )
    op.create_table(
        "process_keys",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("run_id", _str(128), nullable=False),
        sa.Column("process_index", sa.Integer(), nullable=False),
        sa.Column("function", _str(1024), nullable=False),
        sa.Column("event", _str(16), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.Column("compiles", sa.BigInteger(), nullable=False),
        sa.Column("writes", sa.BigInteger(), nullable=False),
        sa.Column("reason", _str(1024), nullable=True),
        sa.Column("compile_s", sa.Float(), nullable=True),
        sa.Column("retrieval_s", sa.Float(), nullable=False),
        sa.Column("jax_saved_s", sa.Float(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("first_at", sa.Float(), nullable=False),
        sa.Column("last_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("cache", "key", "run_id", "process_index"),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_process_keys_process", "process_keys", ["cache", "run_id", "process_index"])
    op.create_index("ix_process_keys_writes", "process_keys", ["cache", "key"], sqlite_where=sa.text(_WROTE),
                    postgresql_where=sa.text(_WROTE))

    op.create_table(
        "prune_items",
        sa.Column("prune_id", sa.Integer(), nullable=False),
        sa.Column("name", _str(1024), nullable=False),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("prune_id", "name"),
    )
    op.create_index("ix_prune_items_key", "prune_items", ["key"])

    op.create_table(
        "prunes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("who", _str(128), nullable=False),
        sa.Column("policy", sa.JSON(), nullable=False),
        sa.Column("deleted", sa.Integer(), nullable=False),
        sa.Column("bytes_freed", sa.BigInteger(), nullable=False),
        sa.Column("already_gone", sa.Integer(), nullable=False),
        sa.Column("changed", sa.Integer(), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.Column("kind", _str(16), server_default="prune", nullable=False),
        sa.Column("state", _str(16), server_default="done", nullable=False),
        sa.Column("planned", sa.Integer(), server_default="0", nullable=False),
        sa.Column("planned_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("ended_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_prunes_cache", "prunes", ["cache"])

    op.create_table(
        "record_files",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("name", _str(1024), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("mtime_s", sa.Float(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=True),
        sa.Column("error", _str(2048), nullable=True),
        sa.PrimaryKeyConstraint("cache", "name"),
    )
    op.create_index("ix_record_files_mtime", "record_files", ["cache", "mtime_s"])

    op.create_table(
        "report_inbox",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("run_id", _str(128), nullable=False),
        sa.Column("process_index", sa.Integer(), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
        sa.Column("source", _str(16), nullable=False),
        sa.Column("record", _str(1024), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("received_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("cache", "run_id", "process_index"),
    )
    op.create_index("ix_report_inbox_received", "report_inbox", ["cache", "received_s"])

    op.create_table(
        "runs",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("run_id", _str(128), nullable=False),
        sa.Column("process_index", sa.Integer(), nullable=False),
        sa.Column("job", _str(256), nullable=False),
        sa.Column("process_count", sa.Integer(), nullable=False),
        sa.Column("host", _str(1024), nullable=False),
        sa.Column("topology", _str(1024), nullable=True),
        sa.Column("cache_dir", _str(1024), nullable=True),
        sa.Column("jax", _str(1024), nullable=False),
        sa.Column("jaxlib", _str(1024), nullable=False),
        sa.Column("backend", _str(1024), nullable=True),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("fingerprint_digest", _str(32), nullable=False),
        sa.Column("started_s", sa.Float(), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
        sa.Column("final", sa.Boolean(), nullable=False),
        sa.Column("pid", sa.BigInteger(), nullable=True),
        sa.Column("keys", sa.Integer(), nullable=False),
        sa.Column("source", _str(16), nullable=False),
        sa.Column("kind", _str(16), server_default="job", nullable=False),
        sa.Column("ingested_s", sa.Float(), nullable=False),
        sa.Column("hits", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("compiles", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("writes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("saved_s", sa.Float(), server_default="0", nullable=False),
        sa.Column("local", sa.JSON(none_as_null=True), nullable=True),
        sa.PrimaryKeyConstraint("cache", "run_id", "process_index"),
    )
    op.create_index("ix_runs_job", "runs", ["cache", "job", "updated_s"])
    op.create_index("ix_runs_updated", "runs", ["cache", "updated_s"])

    op.create_table(
        "usage",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("run_id", _str(128), nullable=False),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("job", _str(256), nullable=False),
        sa.Column("kind", _str(16), nullable=False),
        sa.Column("process_index", sa.Integer(), nullable=False),
        sa.Column("processes", sa.Integer(), nullable=False),
        sa.Column("function", _str(1024), nullable=False),
        sa.Column("event", _str(16), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.Column("compiles", sa.BigInteger(), nullable=False),
        sa.Column("writes", sa.BigInteger(), nullable=False),
        sa.Column("reason", _str(1024), nullable=True),
        sa.Column("compile_s", sa.Float(), nullable=False),
        sa.Column("retrieval_s", sa.Float(), nullable=False),
        sa.Column("jax_saved_s", sa.Float(), nullable=False),
        sa.Column("saved_s", sa.Float(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("first_at", sa.Float(), nullable=False),
        sa.Column("last_at", sa.Float(), nullable=False),
        sa.Column("last_hit_s", sa.Float(), nullable=True),
        sa.Column("updated_s", sa.Float(), nullable=False),
        sa.Column("missed", sa.Integer(), nullable=False),
        sa.Column("counted", sa.Integer(), nullable=False),
        sa.Column("parts", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("program", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("cause", _str(32), nullable=True),
        sa.Column("differs", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("nearest", _str(512), nullable=True),
        sa.Column("fix", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("cache", "run_id", "key", "job", "kind"),
        postgresql_with={"fillfactor": 80},
    )
    op.create_index("ix_usage_function", "usage", ["cache", "function", "first_at"])
    op.create_index("ix_usage_job", "usage", ["cache", "job", "key"])
    op.create_index("ix_usage_key", "usage", ["cache", "key", "first_at"])

    op.create_table(
        "verifications",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("classification", _str(16), nullable=False),
        sa.Column("classes", sa.JSON(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("sha256", _str(64), nullable=True),
        sa.Column("attested_sha256", _str(64), nullable=True),
        sa.Column("attested_by", _str(512), nullable=True),
        sa.Column("embedded_module", _str(1024), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=True),
        sa.Column("checked_s", sa.Float(), nullable=False),
        sa.Column("trusted", _str(64), nullable=True),
        sa.PrimaryKeyConstraint("cache", "key"),
    )
    op.create_index("ix_verifications_class", "verifications", ["cache", "classification"])

    op.create_table(
        "warmup_keys",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("warmup_id", _str(128), nullable=False),
        sa.Column("key", _str(512), nullable=False),
        sa.Column("function", _str(1024), nullable=False),
        sa.Column("status", _str(16), nullable=False),
        sa.Column("compile_s", sa.Float(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("reason", _str(1024), nullable=True),
        sa.Column("parts", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("program", sa.JSON(none_as_null=True), nullable=True),
        sa.PrimaryKeyConstraint("cache", "warmup_id", "key"),
    )
    op.create_index("ix_warmup_keys_function", "warmup_keys", ["cache", "function"])
    op.create_index("ix_warmup_keys_key", "warmup_keys", ["cache", "key"])

    op.create_table(
        "warmups",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("id", _str(128), nullable=False),
        sa.Column("job", _str(256), nullable=False),
        sa.Column("topology", _str(64), nullable=False),
        sa.Column("platform", _str(16), nullable=False),
        sa.Column("gpu_model", _str(256), nullable=True),
        sa.Column("started_s", sa.Float(), nullable=False),
        sa.Column("finished_s", sa.Float(), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("programs", sa.Integer(), nullable=False),
        sa.Column("written", sa.Integer(), nullable=False),
        sa.Column("present", sa.Integer(), nullable=False),
        sa.Column("not_written", sa.Integer(), nullable=False),
        sa.Column("compile_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("cache", "id"),
    )
    op.create_index("ix_warmups_finished", "warmups", ["cache", "finished_s"])

    # What every process of every replica shares besides the index: change counts and loop health.
    op.create_table(
        "change_counts",
        sa.Column("cache", _str(64), nullable=False),
        sa.Column("entries", sa.BigInteger(), nullable=False),
        sa.Column("usage", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("cache"),
    )
    op.create_table(
        "loop_health",
        sa.Column("loop", _str(32), nullable=False),
        sa.Column("status", sa.JSON(), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("loop"),
    )


def downgrade() -> None:
    # Their indexes go with them.
    for table in ("warmups", "warmup_keys", "verifications", "usage", "runs", "report_inbox", "record_files",
                  "prunes", "prune_items", "process_keys", "pins", "key_stats", "key_history", "entries", "caches",
                  "attestations", "attestation_conflicts", "change_counts", "loop_health"):
        op.drop_table(table)
