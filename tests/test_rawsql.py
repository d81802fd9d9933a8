"""catalog.rawsql's statements on both backends, on a table of their own: IN lists of any length, a batch of row
updates in one statement, and a parameter the caller forgot, which must fail rather than bind NULL."""

from __future__ import annotations

import json

import psycopg
import pytest
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    bindparam,
    create_engine,
    select,
)

from jaxcache.service.catalog import rawsql
from jaxcache.service.catalog.schema import Str

_meta = MetaData()
_things = Table("things", _meta, Column("owner", Str(16), primary_key=True), Column("name", Str(16), primary_key=True),
                Column("size", BigInteger), Column("count", Integer), Column("seconds", Float), Column("note", Str(16)))
_kept = Table("kept", _meta, Column("owner", Str(16), primary_key=True), Column("n", Integer, primary_key=True),
              Column("final", Boolean), Column("blob", LargeBinary), Column("doc", JSON), Column("size", BigInteger))


@pytest.fixture
def conn(catalog_url):
    engine = create_engine(catalog_url)
    _meta.create_all(engine)
    with engine.begin() as c:
        # Names that sort differently by locale and by code point, as keys and function names do.
        c.execute(_things.insert(), [
            {"owner": o, "name": f"{n}_{i}", "size": i, "count": 0, "seconds": 0.0, "note": None}
            for o in ("a", "B") for n in ("jit_b", "JIT_A") for i in range(700)])
        yield c
    engine.dispose()


def _named(within: rawsql.Within):
    return select(_things.c.name).where(_things.c.owner == bindparam("owner"), within(_things.c.name))


def test_fetch_in_finds_every_value_of_any_length_once(conn):
    for n in (0, 1, 9, 512, 513, 1400):
        wanted = [f"{p}_{i}" for p in ("jit_b", "JIT_A") for i in range(700)][:n] + ["nobody"]
        found = [r[0] for r in rawsql.fetch_in(conn, "test-named", _named, {"owner": "B"}, wanted)]
        assert sorted(found) == sorted(wanted[:-1])


def test_update_rows_sets_only_the_columns_of_the_rows_named(conn):
    # A float column given whole numbers and fractions (0 and 0.25): one array type on PostgreSQL.
    rows = [{"owner": "B", "name": f"JIT_A_{i}", "size": 2**40 + i, "count": i, "seconds": i // 4 if i % 2 else i / 4,
             "note": None if i % 2 else "é"} for i in range(600)]
    rawsql.update_rows(conn, _things, ["owner", "name"], ["size", "count", "seconds", "note"], rows)
    rawsql.update_rows(conn, _things, ["owner", "name"], ["count"], [])
    got = {(o, n): (s, c, t, note) for o, n, s, c, t, note in conn.execute(select(_things))}
    assert all(got["B", r["name"]] == (r["size"], r["count"], r["seconds"], r["note"]) for r in rows)
    assert got["a", "JIT_A_5"] == (5, 0, 0.0, None)  # same name, another owner: untouched
    assert got["B", "jit_b_5"] == (5, 0, 0.0, None)
    assert sum(1 for v in got.values() if v[1]) == 599


#: What each driver raises for a parameter not given (SQLite's are positional here, looked up by name first).
_MISSING = (KeyError, psycopg.ProgrammingError)


def test_a_parameter_not_given_is_an_error_not_null(conn):
    with pytest.raises(_MISSING, match="owner"):
        rawsql.fetch(conn, "test-missing", lambda: select(_things.c.name).where(_things.c.owner == bindparam("owner")),
                     {})
    statement = lambda: _things.update().where(_things.c.owner == bindparam("o")).values(note=bindparam("n"))  # noqa: E731
    with pytest.raises(_MISSING, match="'n'|: n"):
        rawsql.execute_many(conn, "test-missing-update", statement, [{"o": "a"}])
    assert conn.execute(select(_things.c.note).where(_things.c.note.is_not(None))).all() == []


def test_upsert_many_inserts_and_replaces_the_last_row_of_each_key(conn):
    def row(owner: str, n: int, version: int) -> dict:
        return {"owner": owner, "n": n, "final": version % 2 == 1, "blob": bytes([version, 0, 255]),
                "doc": f'{{"v": {version}}}', "size": 2**40 + version}

    rawsql.upsert_many(conn, _kept, [row("B", n, 0) for n in range(300)])
    rawsql.upsert_many(conn, _kept, [])
    # Replacing some, adding some, and the same key twice in one call: the later one stays.
    rawsql.upsert_many(conn, _kept, [row("B", 5, 1), row("a", 5, 2), row("B", 5, 3), row("B", 299, 4)])
    got = {(o, n): (f, bytes(b), d if isinstance(d, dict) else json.loads(d), s)
           for o, n, f, b, d, s in conn.execute(select(_kept))}
    assert len(got) == 301
    assert got["B", 5] == (True, bytes([3, 0, 255]), {"v": 3}, 2**40 + 3)
    assert got["a", 5] == (False, bytes([2, 0, 255]), {"v": 2}, 2**40 + 2)
    assert got["B", 299][3] == 2**40 + 4 and got["B", 6] == (False, bytes([0, 0, 255]), {"v": 0}, 2**40)


def test_bytes_go_and_come_back_in_binary_as_they_were(conn):
    blobs = [bytes(range(256)) * 40, b'"\\{},NULL', b"", None]
    rawsql.upsert_many(conn, _kept, [{"owner": "c", "n": i, "final": False, "blob": b, "doc": "{}", "size": 2**40 + i}
                                     for i, b in enumerate(blobs)])

    def build(within: rawsql.Within):
        return select(_kept.c.n, _kept.c.blob, _kept.c.owner, _kept.c.size, _kept.c.final).where(
            _kept.c.owner == bindparam("owner"), within(_kept.c.n))

    for binary in (False, True):
        got = {n: (None if b is None else bytes(b), o, s, bool(f)) for n, b, o, s, f in rawsql.fetch_in(
            conn, "test-blobs", build, {"owner": "c"}, [0, 1, 2, 3, 4], binary=binary)}
        assert got == {i: (b, "c", 2**40 + i, False) for i, b in enumerate(blobs)}
