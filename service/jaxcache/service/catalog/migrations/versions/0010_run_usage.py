"""One usage row per run and key instead of one per process and key (a run's processes summed); each process's
figures packed in ``process_keys``, its totals on its run row (a storm's 200,000 rows were most of its cost).

Revision ID: 0010
Revises: 0009
Create Date: 2027-02-01

Not additive: replicas still on 0009 cannot write the new usage table, so stop them before the first replica on
0010 starts (reports they refuse meanwhile reach the catalog from their record files at the next rescan). Rows are
converted; a run's rows of one key keep the first explanation among them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_OLD = "usage_0009"
_BATCH = 2000


def _str(length: int) -> sa.String:
    # Code-point order on PostgreSQL too (see catalog.models.Str).
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def _json() -> sa.JSON:
    return sa.JSON(none_as_null=True)


def upgrade() -> None:
    op.create_table(
        "process_keys",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("run_id", _str(128), primary_key=True),
        sa.Column("process_index", sa.Integer, primary_key=True),
        sa.Column("figures", sa.LargeBinary, nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        # Kept out of line as it is: compressing each process's figures (pglz) was most of their insert's cost.
        op.execute("ALTER TABLE process_keys ALTER COLUMN figures SET STORAGE EXTERNAL")
    with op.batch_alter_table("runs") as batch:
        for name in ("hits", "compiles", "writes"):
            batch.add_column(sa.Column(name, sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("saved_s", sa.Float, nullable=False, server_default="0"))
    for index in ("ix_usage_key", "ix_usage_job", "ix_usage_function"):
        op.drop_index(index, table_name="usage")
    op.rename_table("usage", _OLD)
    op.create_table(
        "usage",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("run_id", _str(128), primary_key=True),
        sa.Column("key", _str(512), primary_key=True),
        sa.Column("job", _str(256), primary_key=True),
        sa.Column("kind", _str(16), primary_key=True),
        sa.Column("process_index", sa.Integer, nullable=False),
        sa.Column("processes", sa.Integer, nullable=False),
        sa.Column("function", _str(1024), nullable=False),
        sa.Column("event", _str(16), nullable=False),
        sa.Column("hits", sa.BigInteger, nullable=False),
        sa.Column("compiles", sa.BigInteger, nullable=False),
        sa.Column("writes", sa.BigInteger, nullable=False),
        sa.Column("reason", _str(1024), nullable=True),
        sa.Column("compile_s", sa.Float, nullable=False),
        sa.Column("retrieval_s", sa.Float, nullable=False),
        sa.Column("jax_saved_s", sa.Float, nullable=False),
        sa.Column("saved_s", sa.Float, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=True),
        sa.Column("first_at", sa.Float, nullable=False),
        sa.Column("last_at", sa.Float, nullable=False),
        sa.Column("last_hit_s", sa.Float, nullable=True),
        sa.Column("updated_s", sa.Float, nullable=False),
        sa.Column("writer_process", sa.Integer, nullable=True),
        sa.Column("writer_at_s", sa.Float, nullable=True),
        sa.Column("writer_compile_s", sa.Float, nullable=True),
        sa.Column("missed", sa.Integer, nullable=False),
        sa.Column("counted", sa.Integer, nullable=False),
        sa.Column("parts", _json(), nullable=True),
        sa.Column("program", _json(), nullable=True),
        sa.Column("cause", _str(32), nullable=True),
        sa.Column("differs", _json(), nullable=True),
        sa.Column("nearest", _str(512), nullable=True),
        sa.Column("fix", sa.Text, nullable=True),
        postgresql_with={"fillfactor": 80},  # see catalog.run_tables.UsageRow
    )
    op.create_index("ix_usage_key", "usage", ["cache", "key", "first_at"])
    op.create_index("ix_usage_job", "usage", ["cache", "job", "key"])
    op.create_index("ix_usage_function", "usage", ["cache", "function", "first_at"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE key_stats SET (fillfactor = 80)")  # for the pages written from now on
    _convert(op.get_bind())
    op.drop_table(_OLD)


_OLD_COLUMNS = ("key", "function", "event", "hits", "compiles", "writes", "reason", "compile_s", "retrieval_s",
                "jax_saved_s", "saved_s", "size_bytes", "first_at", "last_at")
_KEPT = ("parts", "program", "cause", "differs", "nearest", "fix")


def _convert(conn: sa.Connection) -> None:
    """Every process's rows into its figures and totals, every run's into one row per key (a run at a time)."""
    from jaxcache.service.ingestion import figures, groups

    meta = sa.MetaData()
    old = sa.Table(_OLD, meta, autoload_with=conn)
    runs = sa.Table("runs", meta, autoload_with=conn)
    usage = sa.Table("usage", meta, autoload_with=conn)
    keys_table = sa.Table("process_keys", meta, autoload_with=conn)
    query = (sa.select(old.c.cache, old.c.run_id, old.c.process_index, runs.c.job, runs.c.kind, runs.c.updated_s,
                       runs.c.started_s, *(old.c[n] for n in _OLD_COLUMNS), *(old.c[n] for n in _KEPT))
             .join(runs, sa.and_(runs.c.cache == old.c.cache, runs.c.run_id == old.c.run_id,
                                 runs.c.process_index == old.c.process_index))
             .order_by(old.c.cache, old.c.run_id, old.c.process_index, old.c.key))
    run: tuple[str, str] | None = None
    rows: list[Any] = []
    for row in conn.execute(query):
        if (row.cache, row.run_id) != run and rows:
            _convert_run(conn, rows, runs, usage, keys_table, figures, groups)
            rows = []
        run = (row.cache, row.run_id)
        rows.append(row)
    if rows:
        _convert_run(conn, rows, runs, usage, keys_table, figures, groups)


def _convert_run(conn: sa.Connection, rows: list[Any], runs: sa.Table, usage: sa.Table, keys_table: sa.Table,
                 figures: Any, groups: Any) -> None:
    cache, run_id = rows[0].cache, rows[0].run_id
    by_process: dict[int, list[Any]] = defaultdict(list)
    for r in rows:
        by_process[r.process_index].append(r)
    parts: dict[tuple[str, str, str], list[Any]] = defaultdict(list)
    kept: dict[tuple[str, str, str], dict[str, Any]] = {}
    packed, totals = [], []
    for index, mine in sorted(by_process.items()):
        first = mine[0]
        fig = figures.of_rows([tuple(getattr(r, n) for n in _OLD_COLUMNS) for r in mine])
        packed.append({"cache": cache, "run_id": run_id, "process_index": index, "figures": figures.encode(fig)})
        totals.append({"b_cache": cache, "b_run": run_id, "b_process": index, "b_hits": sum(fig.hits),
                       "b_compiles": sum(fig.compiles), "b_writes": sum(fig.writes), "b_saved": sum(fig.saved_s)})
        for r, values in zip(mine, fig.rows(), strict=True):
            ident = (r.key, first.job, first.kind)
            parts[ident].append((values, index, first.updated_s, first.started_s))
            have = kept.setdefault(ident, {n: None for n in _KEPT})
            for name in ("parts", "program"):
                if have[name] is None:
                    have[name] = getattr(r, name)
            if have["cause"] is None and r.cause is not None:
                have.update({n: getattr(r, n) for n in ("cause", "differs", "nearest", "fix")})
    out = []
    for (key, job, kind), found in sorted(parts.items()):
        row = groups.build(kind, found)
        explained = kept[(key, job, kind)]
        out.append({"cache": cache, "run_id": run_id, "key": key, "job": job, "kind": kind, **row, **explained,
                    "counted": row["missed"] if explained["cause"] is not None else 0})
    for i in range(0, len(packed), _BATCH):
        conn.execute(keys_table.insert(), packed[i : i + _BATCH])
    conn.execute(runs.update().where(runs.c.cache == sa.bindparam("b_cache"), runs.c.run_id == sa.bindparam("b_run"),
                                     runs.c.process_index == sa.bindparam("b_process"))
                 .values(hits=sa.bindparam("b_hits"), compiles=sa.bindparam("b_compiles"),
                         writes=sa.bindparam("b_writes"), saved_s=sa.bindparam("b_saved")), totals)
    for i in range(0, len(out), _BATCH):
        conn.execute(usage.insert(), out[i : i + _BATCH])


def downgrade() -> None:
    op.rename_table("usage", _OLD)
    for index in ("ix_usage_key", "ix_usage_job", "ix_usage_function"):
        op.drop_index(index, table_name=_OLD)
    op.create_table(
        "usage",
        sa.Column("cache", _str(64), primary_key=True),
        sa.Column("run_id", _str(128), primary_key=True),
        sa.Column("process_index", sa.Integer, primary_key=True),
        sa.Column("key", _str(512), primary_key=True),
        sa.Column("job", _str(256), nullable=False),
        sa.Column("function", _str(1024), nullable=False),
        sa.Column("event", _str(16), nullable=False),
        sa.Column("hits", sa.BigInteger, nullable=False),
        sa.Column("compiles", sa.BigInteger, nullable=False),
        sa.Column("writes", sa.BigInteger, nullable=False),
        sa.Column("reason", _str(1024), nullable=True),
        sa.Column("compile_s", sa.Float, nullable=True),
        sa.Column("retrieval_s", sa.Float, nullable=False),
        sa.Column("jax_saved_s", sa.Float, nullable=False),
        sa.Column("saved_s", sa.Float, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=True),
        sa.Column("first_at", sa.Float, nullable=False),
        sa.Column("last_at", sa.Float, nullable=False),
        sa.Column("kind", _str(16), nullable=False, server_default="job"),
        sa.Column("parts", sa.JSON, nullable=True),
        sa.Column("program", sa.JSON, nullable=True),
        sa.Column("cause", _str(32), nullable=True),
        sa.Column("differs", sa.JSON, nullable=True),
        sa.Column("nearest", _str(512), nullable=True),
        sa.Column("fix", sa.Text, nullable=True),
    )
    op.create_index("ix_usage_key", "usage", ["cache", "key", "first_at"])
    op.create_index("ix_usage_job", "usage", ["cache", "job", "key"])
    op.create_index("ix_usage_function", "usage", ["cache", "function", "first_at"])
    _expand(op.get_bind())
    op.drop_table(_OLD)
    with op.batch_alter_table("runs") as batch:
        for name in ("saved_s", "writes", "compiles", "hits"):
            batch.drop_column(name)
    op.drop_table("process_keys")


def _expand(conn: sa.Connection) -> None:
    """Each process's figures back into one row per key, with its run's row's parts, program and explanation."""
    from jaxcache.service.ingestion import figures

    meta = sa.MetaData()
    folded = sa.Table(_OLD, meta, autoload_with=conn)
    runs = sa.Table("runs", meta, autoload_with=conn)
    usage = sa.Table("usage", meta, autoload_with=conn)
    keys_table = sa.Table("process_keys", meta, autoload_with=conn)
    shared = {(r.cache, r.run_id, r.key, r.job, r.kind): {n: getattr(r, n) for n in _KEPT}
              for r in conn.execute(sa.select(folded.c.cache, folded.c.run_id, folded.c.key, folded.c.job,
                                              folded.c.kind, *(folded.c[n] for n in _KEPT)))}
    out: list[dict[str, Any]] = []
    for r in conn.execute(sa.select(keys_table, runs.c.job, runs.c.kind).join(runs, sa.and_(
            runs.c.cache == keys_table.c.cache, runs.c.run_id == keys_table.c.run_id,
            runs.c.process_index == keys_table.c.process_index))):
        for values in figures.decode(r.figures).rows():
            row = dict(zip(_OLD_COLUMNS, values, strict=True))
            kept = shared.get((r.cache, r.run_id, row["key"], r.job, r.kind), dict.fromkeys(_KEPT))
            if not figures.is_miss(r.kind, row["event"]):
                kept = {**kept, "cause": None, "differs": None, "nearest": None, "fix": None}
            out.append({"cache": r.cache, "run_id": r.run_id, "process_index": r.process_index, "job": r.job,
                        "kind": r.kind, **row, **kept})
            if len(out) >= _BATCH:
                conn.execute(usage.insert(), out)
                out = []
    if out:
        conn.execute(usage.insert(), out)
