"""Alembic environment of the catalog. The service runs it through :mod:`jaxcache.service.catalog.migrate` with an open
connection; for writing a revision, the alembic command line works too (see README.md here)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from jaxcache.service.catalog.models import Base

config = context.config


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite alters tables by copying them; batch mode makes op.add_column and friends do that.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    # Command line: alembic -c service/jaxcache/service/catalog/migrations/alembic.ini -x db=URL ... (or JAXCACHE_DB)
    url = context.get_x_argument(as_dictionary=True).get("db") or os.environ.get("JAXCACHE_DB")
    if not url:
        raise SystemExit("give the catalog database: alembic ... -x db=sqlite:////tmp/catalog.sqlite (or JAXCACHE_DB)")
    engine = create_engine(url, poolclass=NullPool)
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()


run()
