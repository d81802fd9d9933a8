"""The catalog's Alembic migrations on SQLite and on a real PostgreSQL: empty to head equals the models, catalogs
written before Alembic are adopted (pins and the audit log kept), replicas starting together migrate once."""

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
from sqlalchemy import MetaData, create_engine, inspect, text

from jaxcache.service.catalog import migrate
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import Base

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
    # Nor at expression indexes, which listings by compile seconds need (revision 0003).
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


def test_a_first_release_catalog_keeps_pins_and_audit_log(tmp_path, caplog):
    url = _v1_catalog(tmp_path / "v1.sqlite")
    with caplog.at_level(logging.WARNING, logger="jaxcache.service"):
        Catalog(url).dispose()
    assert _revision(url) == migrate.head()
    assert _schema_diff(url) == []
    assert _rows(url, "SELECT cache, pattern, created_s, created_by FROM pins ORDER BY pattern") == sorted(
        PINS, key=lambda p: p[1])
    assert _rows(url, "SELECT id, cache, at_s, who, policy, deleted, bytes_freed, already_gone, changed, errors "
                      "FROM prunes ORDER BY id") == PRUNES
    # The entries index lacked columns: rebuilt empty, and the cache counts as never scanned (not ready).
    assert _rows(url, "SELECT count(*) FROM entries") == [(0,)]
    assert _rows(url, "SELECT name, url, last_scan_s FROM caches") == [("demo", "/x", None)]
    assert any("entries" in m and "rebuilt" in m for m in caplog.messages)
    # The next audit id follows the kept ones.
    catalog = Catalog(url)
    with catalog.session() as s:
        s.execute(text("INSERT INTO prunes (cache, at_s, who, policy, deleted, bytes_freed, already_gone, changed, "
                       "errors) VALUES ('demo', 1, 'me', '{}', 0, 0, 0, 0, '[]')"))
    catalog.dispose()
    assert _rows(url, "SELECT max(id) FROM prunes") == [(8,)]


def test_a_catalog_of_the_release_before_alembic_is_kept_whole(tmp_path):
    # That release created exactly revision 0001's tables: nothing is rebuilt, reports and entries stay.
    url = f"sqlite:///{tmp_path / 'v2.sqlite'}"
    engine = create_engine(url)
    metadata = MetaData()
    migrate.scripts().get_revision(migrate.INITIAL).module.tables(metadata)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO caches VALUES ('demo', '/x', 123.0, 1.0, NULL)"))
        conn.execute(text("INSERT INTO key_stats (cache, key, hits, saved_s) VALUES ('demo', :k, 4, 2.5)"), {"k": KEY})
        conn.execute(text("INSERT INTO pins VALUES ('demo', 'keep', 1.0, 'me')"))
    engine.dispose()
    Catalog(url).dispose()
    assert _revision(url) == migrate.head()
    assert _rows(url, "SELECT key, hits, saved_s FROM key_stats") == [(KEY, 4, 2.5)]
    assert _rows(url, "SELECT last_scan_s FROM caches") == [(123.0,)]
    assert _rows(url, "SELECT pattern FROM pins") == [("keep",)]


def test_runs_reported_before_run_kinds_are_jobs(catalog_url):
    from alembic import command

    engine = create_engine(catalog_url)
    with engine.begin() as conn:
        command.upgrade(migrate.config(conn), "0003")
        conn.execute(text("INSERT INTO runs (cache, run_id, process_index, job, process_count, host, jax, jaxlib, "
                          "fingerprint, fingerprint_digest, started_s, updated_s, final, keys, source, ingested_s) "
                          "VALUES ('demo', 'r1', 0, 'train', 1, 'h', '1', '1', '{}', 'd', 1, 2, false, 1, 'report', "
                          "3)"))
        conn.execute(text("INSERT INTO usage (cache, run_id, process_index, key, job, function, event, hits, "
                          "compiles, writes, retrieval_s, jax_saved_s, saved_s, first_at, last_at) "
                          "VALUES ('demo', 'r1', 0, :k, 'train', 'jit_f', 'hit', 1, 0, 0, 0, 0, 0, 1, 1)"), {"k": KEY})
    engine.dispose()
    Catalog(catalog_url).dispose()
    assert _revision(catalog_url) == migrate.head()
    assert _rows(catalog_url, "SELECT run_id, kind FROM runs") == [("r1", "job")]
    assert _rows(catalog_url, "SELECT key, kind FROM usage") == [(KEY, "job")]


def test_usage_rows_of_0009_become_one_row_per_run_and_key_and_back(catalog_url):
    """A catalog of per-process usage rows (revision 0009) upgraded: one row per run and key with its processes'
    sums and extremes, each process's figures packed and its totals on its run row, explanations kept; and
    downgraded again, the per-process rows as they were (the explanation of a run's miss on each of its rows)."""
    from alembic import command

    from jaxcache.service.ingestion import figures

    engine = create_engine(catalog_url)
    run_sql = ("INSERT INTO runs (cache, run_id, process_index, job, process_count, host, jax, jaxlib, fingerprint, "
               "fingerprint_digest, started_s, updated_s, final, keys, source, ingested_s, kind) VALUES ('demo', "
               ":run, :p, 'train', 2, 'h', '1', '1', '{}', 'd', 100, :updated, true, 2, 'report', 3, :kind)")
    usage_sql = ("INSERT INTO usage (cache, run_id, process_index, key, job, kind, function, event, hits, compiles, "
                 "writes, reason, compile_s, retrieval_s, jax_saved_s, saved_s, size_bytes, first_at, last_at, cause, "
                 "fix) VALUES ('demo', :run, :p, :k, 'train', :kind, 'jit_f', :event, :hits, :compiles, :writes, "
                 ":reason, :cs, :rs, 0, :saved, :size, :first, :last, :cause, :fix)")
    other = "jit_f-" + "1" * 64
    rows = [  # run r1: process 0 wrote KEY and hit the other key, process 1 compiled KEY and hit the other key
        dict(run="r1", p=0, k=KEY, kind="job", event="write", hits=0, compiles=1, writes=1, reason=None, cs=7.0,
             rs=0.0, saved=0.0, size=100, first=110.0, last=110.0, cause="new_program", fix="nothing to do"),
        dict(run="r1", p=1, k=KEY, kind="job", event="compiled", hits=0, compiles=1, writes=0,
             reason="only process 0 writes the cache", cs=6.5, rs=0.0, saved=0.0, size=None, first=111.0, last=111.0,
             cause=None, fix=None),
        dict(run="r1", p=0, k=other, kind="job", event="hit", hits=2, compiles=0, writes=0, reason=None, cs=None,
             rs=0.5, saved=3.0, size=None, first=120.0, last=130.0, cause=None, fix=None),
        dict(run="r1", p=1, k=other, kind="job", event="hit", hits=1, compiles=0, writes=0, reason=None, cs=None,
             rs=0.25, saved=1.5, size=None, first=121.0, last=125.0, cause=None, fix=None),
        dict(run="v1", p=0, k=other, kind="warmup-verify", event="hit", hits=4, compiles=0, writes=0, reason=None,
             cs=None, rs=0.0, saved=0.0, size=None, first=90.0, last=90.0, cause=None, fix=None),
    ]
    with engine.begin() as conn:
        command.upgrade(migrate.config(conn), "0009")
        for run, p, updated, kind in (("r1", 0, 200.0, "job"), ("r1", 1, 201.0, "job"), ("v1", 0, 95.0,
                                                                                         "warmup-verify")):
            conn.execute(text(run_sql), {"run": run, "p": p, "updated": updated, "kind": kind})
        for r in rows:
            conn.execute(text(usage_sql), r)
    before = _rows(catalog_url, "SELECT run_id, process_index, key, kind, event, hits, compiles, writes, reason, "
                                "compile_s, retrieval_s, saved_s, size_bytes, first_at, last_at FROM usage "
                                "ORDER BY run_id, process_index, key")
    Catalog(catalog_url).dispose()
    assert _revision(catalog_url) == migrate.head() and _schema_diff(catalog_url) == []
    got = _rows(catalog_url, "SELECT run_id, key, kind, process_index, processes, event, hits, compiles, writes, "
                             "reason, compile_s, retrieval_s, saved_s, size_bytes, first_at, last_at, last_hit_s, "
                             "updated_s, writer_process, writer_at_s, writer_compile_s, missed, counted, cause "
                             "FROM usage ORDER BY run_id, key")
    assert got == [
        ("r1", KEY, "job", 0, 2, "write", 0, 2, 1, "only process 0 writes the cache", 13.5, 0.0, 0.0, 100, 110.0,
         111.0, None, 201.0, 0, 110.0, 7.0, 2, 2, "new_program"),
        ("r1", other, "job", 0, 2, "hit", 3, 0, 0, None, 0.0, 0.75, 4.5, None, 120.0, 130.0, 130.0, 201.0, None,
         None, None, 0, 0, None),
        ("v1", other, "warmup-verify", 0, 1, "hit", 4, 0, 0, None, 0.0, 0.0, 0.0, None, 90.0, 90.0, None, 95.0,
         None, None, None, 0, 0, None),
    ]
    assert _rows(catalog_url, "SELECT run_id, process_index, hits, compiles, writes, saved_s FROM runs "
                              "ORDER BY run_id, process_index") == [
        ("r1", 0, 2, 1, 1, 3.0), ("r1", 1, 1, 1, 0, 1.5), ("v1", 0, 4, 0, 0, 0.0)]
    packed = {(r, p): figures.decode(bytes(f)) for r, p, f in _rows(
        catalog_url, "SELECT run_id, process_index, figures FROM process_keys")}
    assert packed[("r1", 1)].keys == sorted([KEY, other]) and packed[("r1", 1)].compile_s[0] == 6.5
    engine = create_engine(catalog_url)
    with engine.begin() as conn:
        command.downgrade(migrate.config(conn), "0009")
    engine.dispose()
    assert _rows(catalog_url, "SELECT run_id, process_index, key, kind, event, hits, compiles, writes, reason, "
                              "compile_s, retrieval_s, saved_s, size_bytes, first_at, last_at FROM usage "
                              "ORDER BY run_id, process_index, key") == before
    assert _rows(catalog_url, "SELECT process_index, cause FROM usage WHERE key = :k ORDER BY process_index"
                 .replace(":k", f"'{KEY}'")) == [(0, "new_program"), (1, "new_program")]


def test_a_table_that_cannot_be_rebuilt_stops_the_upgrade_and_changes_nothing(tmp_path):
    path = tmp_path / "odd.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE pins (cache VARCHAR(64), pattern VARCHAR(512), PRIMARY KEY (cache, pattern))")
    db.execute("INSERT INTO pins VALUES ('demo', 'keep')")
    db.commit()
    db.close()
    with pytest.raises(migrate.MigrationError, match="pins"):
        Catalog(f"sqlite:///{path}")
    db = sqlite3.connect(path)
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["pins"]
    assert db.execute("SELECT * FROM pins").fetchall() == [("demo", "keep")]


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
    for name in ("env.py", "script.py.mako", "README.md", "versions/0001_initial.py"):
        assert shipped + name in names, name
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith(shipped + "versions/") and n.endswith(".py")} == {
        p.name for p in (REPO / "service" / "jaxcache" / "service" / "catalog" / "migrations" / "versions").glob("*.py")
    }