"""Alembic environment of the catalog: run by :mod:`jaxcache.service.catalog.migrate` with an open connection, or by
the alembic command line (see README.md here)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from jaxcache.service.catalog.models import Base

config = context.config


def _migrate(connection) -> None:
    # SQLite alters tables by copying them; batch mode makes op.add_column and friends do that.
    context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if (connection := config.attributes.get("connection")) is not None:
    _migrate(connection)
else:  # alembic -c service/jaxcache/service/catalog/migrations/alembic.ini -x db=URL ... (or JAXCACHE_DB)
    url = context.get_x_argument(as_dictionary=True).get("db") or os.environ.get("JAXCACHE_DB")
    if not url:
        raise SystemExit("give the catalog database: alembic ... -x db=sqlite:////tmp/catalog.sqlite (or JAXCACHE_DB)")
    with create_engine(url, poolclass=NullPool).connect() as conn:
        _migrate(conn)
