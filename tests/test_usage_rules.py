"""The usage rules are written once (jaxcache.usage_rules): over random rows, each gives the same value in plain
Python (what the CLI's service-less prune applies) as in the SQL the service builds from it, on SQLite and on
PostgreSQL."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest
from sqlalchemy import BigInteger, Column, Float, Integer, MetaData, Table, create_engine, select

from jaxcache import usage_rules
from jaxcache.records import COMPILED, HIT, JOB, WRITE
from jaxcache.service.catalog.models import Str
from jaxcache.service.catalog.usage import SQL
from jaxcache.service.reports.ingest.usage import first_writer, most_informative
from jaxcache.usage_rules import PY

#: Each rule that gives one value per row, and the columns it takes.
RULES: dict[str, tuple[Any, tuple[str, ...]]] = {
    "used_hits": (usage_rules.used_hits, ("kind", "hits")),
    "saved": (usage_rules.saved, ("kind", "hits", "retrieval_s", "jax_saved_s", "measure")),
    "credited_measure": (usage_rules.credited_measure, ("measure", "retrieval_s")),
    "wrote": (usage_rules.wrote, ("event", "writes")),
    "write_at": (usage_rules.write_at, ("event", "writes", "first_at", "started_at")),
    "hit_at": (usage_rules.hit_at, ("kind", "hits", "first_at", "last_at")),
    "is_miss": (usage_rules.is_miss, ("kind", "event")),
    "is_recent": (usage_rules.is_recent, ("updated_at", "since")),
    "event_rank": (usage_rules.event_rank, ("event",)),
    "event_of": (usage_rules.event_of, ("rank",)),
}
BOOLEAN = {"wrote", "is_miss", "is_recent"}

_table = Table(
    "rows", MetaData(),
    Column("id", Integer, primary_key=True), Column("key", Str(8)), Column("run_id", Str(8)),
    Column("process_index", Integer), Column("kind", Str(16)), Column("event", Str(16)), Column("hits", BigInteger),
    Column("writes", BigInteger), Column("rank", Integer), *(Column(name, Float) for name in (
        "retrieval_s", "jax_saved_s", "measure", "first_at", "last_at", "started_at", "updated_at", "since")),
)


def _random_rows(seed: int, n: int = 400) -> list[dict[str, Any]]:
    """Rows with the values the rules treat apart (0, NULL, ties), one per key, run and process as in process_keys."""
    rng = random.Random(seed)

    def maybe(values: list[Any]) -> Any:
        return None if rng.random() < 0.05 else rng.choice(values)

    def seconds() -> Any:
        return maybe([0.0, 1.0, 2.5, round(rng.uniform(0, 50), 3)])

    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    for i in range(n):
        key, run_id, index = rng.choice("abcd"), rng.choice(["r1", "r2", "R1", "r-1", "r10"]), rng.randrange(3)
        rows[key, run_id, index] = {
            "id": i, "key": key, "run_id": run_id, "process_index": index,
            "kind": maybe([JOB, JOB, "warmup", "verify"]), "event": maybe([HIT, WRITE, COMPILED, "other"]),
            "hits": maybe([0, 0, 1, 3]), "writes": maybe([0, 0, 1, 2]), "rank": maybe([0, 1, 2, 5]),
            "retrieval_s": seconds(), "jax_saved_s": maybe([0.0, -1.0, 4.0, round(rng.uniform(0, 50), 3)]),
            "measure": seconds(), "first_at": seconds(), "last_at": seconds(), "started_at": seconds(),
            "updated_at": seconds(), "since": seconds(),
        }
    return list(rows.values())


@pytest.fixture
def engine(catalog_url):
    eng = create_engine(catalog_url)
    _table.metadata.create_all(eng)
    yield eng
    eng.dispose()


def _same(name: str, value: Any) -> Any:
    return None if value is None else bool(value) if name in BOOLEAN else value


@pytest.mark.parametrize("seed", [1, 2])
def test_every_rule_gives_the_same_value_in_python_and_in_sql(engine, seed):
    rows = _random_rows(seed)
    with engine.begin() as conn:
        conn.execute(_table.insert(), rows)
        c = _table.c
        got = {r.id: r for r in conn.execute(select(c.id, *(
            rule(SQL, *(c[n] for n in columns)).label(name) for name, (rule, columns) in RULES.items())))}
    for row in rows:
        for name, (rule, columns) in RULES.items():
            expected = rule(PY, *(row[n] for n in columns))
            assert _same(name, getattr(got[row["id"]], name)) == _same(name, expected), (name, row)


@pytest.mark.parametrize("seed", [3, 4])
def test_the_first_writer_and_the_kept_event_are_the_same_in_python_and_in_sql(engine, seed):
    rows = _random_rows(seed)
    c = _table.c
    at = usage_rules.write_at(SQL, c.event, c.writes, c.first_at, c.started_at)
    ranked = select(c.id, c.key, c.run_id, c.process_index, at.label("at")).subquery()
    with engine.begin() as conn:
        conn.execute(_table.insert(), rows)
        rank = dict(conn.execute(select(ranked.c.id, first_writer([ranked.c.key], ranked.c.at, ranked.c.run_id,
                                                                  ranked.c.process_index))).all())
        kept = dict(conn.execute(select(c.key, most_informative(c.event)).group_by(c.key)).all())
    by_key = defaultdict(list)
    for row in rows:
        by_key[row["key"]].append(row)
    for key, group in by_key.items():
        def order(r: dict[str, Any]) -> tuple[Any, ...]:
            return usage_rules.writer_order(
                PY, usage_rules.write_at(PY, r["event"], r["writes"], r["first_at"], r["started_at"]), r["run_id"],
                r["process_index"])
        assert [rank[r["id"]] for r in sorted(group, key=order)] == list(range(1, len(group) + 1)), key
        best = max(usage_rules.event_rank(PY, r["event"]) for r in group)
        assert kept[key] == usage_rules.event_of(PY, best), key
