"""Bring the catalog to Alembic's head at start (``migrations/README.md``): one transaction under the ``migrate``
lock, so a replica killed halfway leaves the previous schema; catalogs of the retired history are refused."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from jaxcache.errors import JaxcacheError

log = logging.getLogger("jaxcache.service")

SCRIPTS = Path(__file__).parent / "migrations"
#: The revisions of the schema's earlier history, which this version does not upgrade from.
RETIRED = frozenset({*(f"{n:04d}" for n in range(1, 12)), *(str(n) for n in range(1, 5))})


class MigrationError(JaxcacheError):
    """The catalog database cannot be brought to this version's schema."""


def config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    cfg.attributes["connection"] = connection  # env.py migrates on it (None: the alembic command line)
    return cfg


def scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(config())


def head() -> str | None:
    return scripts().get_current_head()


def current(connection: Connection) -> str | None:
    """The revision the database is at (None: empty, or written before Alembic)."""
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(catalog) -> str | None:
    """Upgrade to head and return the revision; a newer one is left alone, a retired one raises MigrationError."""
    with catalog.locks.get("migrate"), catalog.engine.begin() as conn:
        at = current(conn)
        if at in RETIRED or (at is None and "caches" in inspect(conn).get_table_names()):
            raise MigrationError(
                f"catalog {catalog.engine.url} was written by an earlier version of jaxcache (schema "
                f"{at or 'before revisions'}), which this version does not upgrade: move the SQLite file away (or "
                "drop and create the PostgreSQL database) and start again. Rescans rebuild the entries and run "
                "history from the cache roots; lost are what only the catalog held: pins, the prune audit log, "
                "verdicts, and the history of run records that retention already deleted")
        if at is not None and at not in {s.revision for s in scripts().walk_revisions()}:
            log.warning("catalog %s is at schema revision %s, newer than this version of jaxcache knows (%s): "
                        "running on it without migrating; upgrade this replica", catalog.engine.url, at, head())
            return at
        command.upgrade(config(conn), "head")
        after = current(conn)
    if after != at:
        log.info("catalog %s: schema upgraded from %s to %s", catalog.engine.url, at or "empty", after)
    return after
