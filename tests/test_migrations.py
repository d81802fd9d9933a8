"""The catalog's Alembic migrations on SQLite and on a real PostgreSQL: empty to head equals the models, catalogs
of the schema's earlier history are refused with what to do (and left as they are), replicas starting together
migrate once."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from jaxcache.service.catalog import migrate
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import Base, VerificationRow

REPO = Path(__file__).parent.parent

# What jaxcache 0.1's first service release created (SQLAlchemy's create_all of its models, on SQLite).
V1_DDL = """
CREATE TABLE caches (name VARCHAR(64) NOT NULL, url VARCHAR(1024) NOT NULL, last_scan_s FLOAT,
    last_scan_seconds FLOAT, last_scan_error VARCHAR(2048), PRIMARY KEY (name));
CREATE TABLE entries (cache VARCHAR(64) NOT NULL, "key" VARCHAR(512) NOT NULL, kind VARCHAR(8) NOT NULL,
    module VARCHAR(448) NOT NULL, name VARCHAR(512) NOT NULL, size_bytes BIGINT NOT NULL, created_s FLOAT NOT NULL,
    last_used_s FLOAT NOT NULL, generation BIGINT, has_atime BOOLEAN NOT NULL, atime_ns BIGINT,
    compression VARCHAR(16), compile_seconds INTEGER, status VARCHAR(16), reason VARCHAR(1024),
    first_seen_s FLOAT NOT NULL, PRIMARY KEY (cache, "key", kind));
CREATE INDEX ix_entries_created ON entries (cache, kind, created_s, "key");
CREATE INDEX ix_entries_compile ON entries (cache, kind, compile_seconds, "key");
CREATE INDEX ix_entries_module ON entries (cache, kind, module);
CREATE INDEX ix_entries_last_used ON entries (cache, kind, last_used_s, "key");
CREATE INDEX ix_entries_size ON entries (cache, kind, size_bytes, "key");
CREATE TABLE pins (cache VARCHAR(64) NOT NULL, pattern VARCHAR(512) NOT NULL, created_s FLOAT NOT NULL,
    created_by VARCHAR(128) NOT NULL, PRIMARY KEY (cache, pattern));
CREATE TABLE prunes (id INTEGER NOT NULL, cache VARCHAR(64) NOT NULL, at_s FLOAT NOT NULL, who VARCHAR(128) NOT NULL,
    policy JSON NOT NULL, deleted INTEGER NOT NULL, bytes_freed BIGINT NOT NULL, already_gone INTEGER NOT NULL,
    changed INTEGER NOT NULL, errors JSON NOT NULL, PRIMARY KEY (id));
CREATE INDEX ix_prunes_cache ON prunes (cache);
"""
KEY = "jit_f-" + "0" * 64
PINS = [("demo", "jit_train*", 100.0, "token:abc"), ("demo", KEY, 101.0, "token:def")]
PRUNES = [(1, "demo", 200.0, "token:abc", json.dumps({"corrupt": True}), 3, 3000, 0, 0, "[]"),
          (7, "demo", 300.0, "token:def", json.dumps({"unused_for": "14d"}), 1, 10, 1, 0, '["gone"]')]


def _schema_diff(url: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    finally:
        engine.dispose()


def _rows(url: str, sql: str) -> list[tuple]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql))]
    finally:
        engine.dispose()


def _revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return migrate.current(conn)
    finally:
        engine.dispose()


def _v1_catalog(path: Path) -> str:
    db = sqlite3.connect(path)
    db.executescript(V1_DDL)
    db.execute("INSERT INTO caches VALUES ('demo', '/x', 123.0, 1.0, NULL)")
    db.execute("INSERT INTO entries VALUES ('demo', ?, 'entry', 'jit_f', ?, 1, 1.0, 1.0, NULL, 0, NULL, 'zstd', 0, "
               "'ok', NULL, 1.0)", (KEY, KEY + "-cache"))
    db.executemany("INSERT INTO pins VALUES (?, ?, ?, ?)", PINS)
    db.executemany("INSERT INTO prunes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", PRUNES)
    db.commit()
    db.close()
    return f"sqlite:///{path}"


def test_empty_to_head_equals_the_models(catalog_url):
    Catalog(catalog_url).dispose()
    assert _revision(catalog_url) == migrate.head()
    assert _schema_diff(catalog_url) == []
    if catalog_url.startswith("postgresql"):
        # compare_metadata does not look at collations: the columns that listings sort by must be "C".
        got = _rows(catalog_url, "SELECT table_name, column_name, collation_name FROM information_schema.columns "
                                 "WHERE table_schema = 'public' AND data_type = 'character varying' "
                                 "AND table_name != 'alembic_version'")
        assert got and all(c == "C" for _, _, c in got), got
    # Nor at expression indexes, which listings by compile seconds need.
    query = ("SELECT sql FROM sqlite_master WHERE name = 'ix_entries_compile_sort'" if catalog_url.startswith("sqlite")
             else "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_entries_compile_sort'")
    (definition,), = _rows(catalog_url, query)
    assert re.search(r"coalesce\(compile_seconds, '?-1'?(::integer)?\)", definition.lower()), definition


def test_starting_again_changes_nothing(catalog_url):
    Catalog(catalog_url).dispose()
    with Catalog(catalog_url).session() as s:
        s.execute(text("INSERT INTO pins VALUES ('demo', 'x*', 1.0, 'me')"))
    Catalog(catalog_url).dispose()
    assert _rows(catalog_url, "SELECT pattern FROM pins") == [("x*",)]


def test_downgrade_to_nothing_and_up_again(catalog_url):
    from alembic import command

    Catalog(catalog_url).dispose()
    engine = create_engine(catalog_url)
    with engine.begin() as conn:
        command.downgrade(migrate.config(conn), "base")
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    engine.dispose()
    Catalog(catalog_url).dispose()
    assert _schema_diff(catalog_url) == []


def test_upgrading_from_5_judges_again_the_verdicts_that_name_a_signature(catalog_url):
    """Revision 6 adds verdicts' ``signature``: those made before it beside a bad signature are made again (#58
    item 7), the others are kept."""
    from alembic import command

    Catalog(catalog_url).dispose()
    engine = create_engine(catalog_url)
    named = {"jit_f-" + "1" * 64: ["jit_f-1…-sig is not a jaxcache signature object (…): ignored"],
             "jit_f-" + "2" * 64: ["a signature claiming key 'ci' does not verify: ignored"],
             "jit_f-" + "3" * 64: []}
    with engine.begin() as conn:
        command.downgrade(migrate.config(conn), "5")
        conn.execute(VerificationRow.__table__.insert().values([
            {"cache": "c", "key": key, "classification": "ok", "classes": ["ok"],
             "reasons": reasons, "size_bytes": 1, "created_s": 1.0, "checked_s": 1.0, "trusted": "t" * 64}
            for key, reasons in named.items()]))
    engine.dispose()
    Catalog(catalog_url).dispose()  # upgrades to head
    assert _revision(catalog_url) == migrate.head() and _schema_diff(catalog_url) == []
    got = dict(_rows(catalog_url, 'SELECT "key", trusted FROM verifications'))
    assert got == {"jit_f-" + "1" * 64: None, "jit_f-" + "2" * 64: None, "jit_f-" + "3" * 64: "t" * 64}, got


def test_upgrading_from_6_keeps_generations_as_version_tokens(catalog_url):
    """Revision 7 makes GCS's integer generations version tokens (text, #61): a GCS root's rows keep theirs as their
    decimal text, so no entry is read again; going back keeps the whole numbers and clears ETags."""
    from alembic import command

    from jaxcache.service.catalog.models import EntryRow, RecordFileRow

    Catalog(catalog_url).dispose()
    engine = create_engine(catalog_url)
    big = 1_718_000_000_123_456  # a GCS generation: 16 digits, past what a 32-bit integer or a float holds exactly
    entry = {"cache": "c", "kind": "entry", "module": "jit_f", "name": f"{KEY}-cache", "size_bytes": 1,
             "created_s": 1.0, "last_used_s": 1.0, "has_atime": False, "first_seen_s": 1.0, "seen_used_s": 1.0}
    with engine.begin() as conn:
        command.downgrade(migrate.config(conn), "6")
        conn.execute(text('INSERT INTO entries (cache, "key", kind, module, name, size_bytes, created_s, last_used_s,'
                          " generation, has_atime, first_seen_s, seen_used_s, hits, saved_s) VALUES (:cache, :key,"
                          " :kind, :module, :name, :size_bytes, :created_s, :last_used_s, :generation, :has_atime,"
                          " :first_seen_s, :seen_used_s, 0, 0)"),
                     [{**entry, "key": KEY, "generation": big}, {**entry, "key": KEY[:-1] + "1", "generation": None}])
        conn.execute(text("INSERT INTO record_files (cache, name, size_bytes, mtime_s, generation)"
                          " VALUES ('c', 'runs/r-p0.json', 1, 1.0, 7)"))
    engine.dispose()
    Catalog(catalog_url).dispose()  # upgrades to head
    assert _revision(catalog_url) == migrate.head() and _schema_diff(catalog_url) == []
    assert dict(_rows(catalog_url, 'SELECT "key", version FROM entries')) == {KEY: str(big), KEY[:-1] + "1": None}
    assert _rows(catalog_url, "SELECT version FROM record_files") == [("7",)]

    engine = create_engine(catalog_url)
    with engine.begin() as conn:
        conn.execute(EntryRow.__table__.update().where(EntryRow.key == KEY[:-1] + "1").values(
            version='"9a0364b9e99bb480dd25e1f0284c8555"'))  # an S3 root's ETag
        conn.execute(RecordFileRow.__table__.update().values(version='"0x8DC9A5B2C3D4E5F"'))  # an Azure one's
        command.downgrade(migrate.config(conn), "6")
    engine.dispose()
    assert dict(_rows(catalog_url, 'SELECT "key", generation FROM entries')) == {KEY: big, KEY[:-1] + "1": None}
    assert _rows(catalog_url, "SELECT generation FROM record_files") == [(None,)]
    Catalog(catalog_url).dispose()
    assert _schema_diff(catalog_url) == []


def _tables(path: Path) -> dict[str, list[tuple]]:
    db = sqlite3.connect(path)
    try:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {n: db.execute(f'SELECT * FROM "{n}"').fetchall() for n in names}
    finally:
        db.close()


def test_a_catalog_from_before_revisions_is_refused_and_left_as_it_is(tmp_path):
    url = _v1_catalog(tmp_path / "v1.sqlite")
    before = _tables(tmp_path / "v1.sqlite")
    with pytest.raises(migrate.MigrationError, match="earlier version of jaxcache .*move the SQLite file away.*"
                                                     "Rescans rebuild.*lost are .*pins"):
        Catalog(url)
    assert _tables(tmp_path / "v1.sqlite") == before


def test_a_catalog_at_a_retired_revision_is_refused_in_one_line_by_serve(tmp_path):
    """A catalog of the schema's earlier history (revisions 0001 to 0011): `jaxcache serve` says what to do in one
    line and exits with the CLI's error status, without a traceback, changing nothing."""
    path = tmp_path / "old.sqlite"
    url = _v1_catalog(path)
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY);"
                     "INSERT INTO alembic_version VALUES ('0011');")
    db.commit()
    db.close()
    before = _tables(path)
    exe = Path(sys.executable).parent / "jaxcache"
    proc = subprocess.run([str(exe), "serve", "--db", url, "--cache", f"demo={tmp_path}", "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    said = [line for line in proc.stderr.splitlines() if "earlier version of jaxcache" in line]
    assert len(said) == 1 and "schema 0011" in said[0] and "start again" in said[0], proc.stderr
    assert _tables(path) == before


def test_the_schema_is_one_revision_and_what_was_added_since():
    """#31: one initial revision (5) for the whole schema; later ones only add, each on the one before."""
    *added, first = migrate.scripts().walk_revisions()  # the head first
    assert first.revision == "5" and first.down_revision is None
    assert [r.revision for r in added] == [str(n) for n in range(5 + len(added), 5, -1)]
    assert (added[0] if added else first).revision == migrate.head()


@pytest.mark.parametrize("revision", ["1", "4"])
def test_a_catalog_at_a_revision_folded_into_the_one_is_refused_and_left_as_it_is(tmp_path, revision):
    """Revisions 1 to 4 became the schema's one revision: a catalog made at one of them lacks what the later ones
    added, so it is refused like the older history, not read as current or as newer."""
    path = tmp_path / "catalog.sqlite"
    url = f"sqlite:///{path}"
    Catalog(url).dispose()
    db = sqlite3.connect(path)
    db.execute("UPDATE alembic_version SET version_num = ?", (revision,))
    db.commit()
    db.close()
    before = _tables(path)
    with pytest.raises(migrate.MigrationError, match=f"schema {revision}\\).*start again"):
        Catalog(url)
    assert _tables(path) == before


def test_a_newer_schema_is_left_alone(catalog_url, caplog):
    Catalog(catalog_url).dispose()
    engine = create_engine(catalog_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with caplog.at_level(logging.WARNING, logger="jaxcache.service"):
        catalog = Catalog(catalog_url)
    with catalog.session() as s:
        s.execute(text("SELECT count(*) FROM entries"))
    catalog.dispose()
    assert _revision(catalog_url) == "9999"
    assert any("9999" in m and "newer" in m for m in caplog.messages)


def test_replicas_starting_together_migrate_once(catalog_url):
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def replica() -> None:
        try:
            start.wait()
            Catalog(catalog_url).dispose()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _revision(catalog_url) == migrate.head()
    assert _rows(catalog_url, "SELECT count(*) FROM alembic_version") == [(1,)]
    assert _schema_diff(catalog_url) == []


def test_revisions_are_shipped_as_package_data(tmp_path):
    # What `pip install ./service` puts in site-packages (the image installs that way, not editable).
    # Built from a copy: a build leaves build/ and *.egg-info behind in the folder it builds.
    source = shutil.copytree(REPO / "service", tmp_path / "src", ignore=shutil.ignore_patterns("*.egg-info", "build"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("jaxcache_service-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = "jaxcache/service/catalog/migrations/"
    for name in ("env.py", "script.py.mako", "README.md", "versions/0005_schema.py"):
        assert shipped + name in names, name
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith(shipped + "versions/") and n.endswith(".py")} == {
        p.name for p in (REPO / "service" / "jaxcache" / "service" / "catalog" / "migrations" / "versions").glob("*.py")
    }