"""Bring the catalog database to the newest schema (Alembic's head) when the service starts.

The revisions live in ``migrations/versions/`` beside this module (shipped as package data; how to add one:
``migrations/README.md``). Replicas that start together take turns (the ``migrate`` lock), and the whole upgrade
is one transaction on both backends: a replica killed halfway leaves the previous schema.

A catalog written before Alembic (jaxcache 0.1's SQLite files) has tables but no ``alembic_version``: it is adopted
as revision 0001. Tables it lacks are created; the index tables that a rescan rebuilds (``entries``,
``record_files``) are dropped and created again when their columns differ (every cache is then marked never
scanned, so replicas report not ready until the next rescan fills them); pins, the prune audit log and ingested
reports are kept as they are, and if one of those is not what 0001 expects, the upgrade stops with an error
rather than lose it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, inspect, update
from sqlalchemy.engine import Connection

from jaxcache.errors import JaxcacheError

log = logging.getLogger("jaxcache.service")

SCRIPTS = Path(__file__).parent / "migrations"
INITIAL = "0001"
#: Tables that are an index of storage: a rescan fills them again.
REBUILT = ("entries", "record_files")


class MigrationError(JaxcacheError):
    """The catalog database cannot be brought to this version's schema."""


def config(connection: Connection | None = None) -> Config:
    """Alembic's configuration for the catalog's scripts, running on ``connection``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def scripts() -> ScriptDirectory:
    """The catalog's revisions."""
    return ScriptDirectory.from_config(config())


def head() -> str | None:
    """The newest revision this version knows."""
    return scripts().get_current_head()


def current(connection: Connection) -> str | None:
    """The revision the database is at (None: empty, or written before Alembic)."""
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(catalog) -> str | None:
    """Upgrade ``catalog``'s database to head (adopting a pre-Alembic catalog first). Returns the revision it is at.

    A database at a revision this version does not know (a newer replica already upgraded it during a rolling
    update) is left alone with a warning: revisions only add, so an older replica keeps working on it.
    """
    with catalog.locks.get("migrate"), catalog.engine.begin() as conn:
        present = set(inspect(conn).get_table_names())
        if "alembic_version" not in present and present & {t.name for t in _initial_tables()}:
            _adopt(conn, present)
            command.stamp(config(conn), INITIAL)
        at = current(conn)
        known = {s.revision for s in scripts().walk_revisions()}
        if at is not None and at not in known:
            log.warning("catalog %s is at schema revision %s, newer than this version of jaxcache knows (%s): "
                        "running on it without migrating; upgrade this replica", catalog.engine.url, at, head())
            return at
        command.upgrade(config(conn), "head")
        after = current(conn)
    if after != at:
        log.info("catalog %s: schema upgraded from %s to %s", catalog.engine.url, at or "empty", after)
    return after


def _initial_tables():
    return scripts().get_revision(INITIAL).module.tables(MetaData())


def _adopt(conn: Connection, present: set[str]) -> None:
    """Make a pre-Alembic catalog equal to revision 0001 (see the module's docstring)."""
    insp = inspect(conn)
    rebuilt = []
    for table in _initial_tables():
        if table.name not in present:
            table.create(conn)
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        missing = [c.name for c in table.columns if c.name not in have]
        if missing:
            if table.name not in REBUILT:
                raise MigrationError(
                    f"catalog table {table.name!r} lacks columns {', '.join(missing)} that this version needs and "
                    "cannot rebuild (it holds what only the catalog knows): export it, move the database away, "
                    "and start the service on a new one"
                )
            log.warning("catalog table %s is from an older version; it is rebuilt by the next rescan", table.name)
            table.drop(conn)
            table.create(conn)
            rebuilt.append(table.name)
            continue
        indexes = {i["name"] for i in insp.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(conn)
    if "entries" in rebuilt:
        caches = _initial_table("caches")
        conn.execute(update(caches).values(last_scan_s=None))


def _initial_table(name: str):
    return next(t for t in _initial_tables() if t.name == name)
