"""Usage rows summed a column at a time (ingestion/stacked.py) are the rows built a tuple at a time (groups.py), and
the fast way is taken only where groups.covered would keep a row's extremes."""

from __future__ import annotations

import random
import time

import msgspec
import pytest

from jaxcache.records import COMPILED, HIT, JOB, WARMUP, WRITE, KeyUsage
from jaxcache.service.ingestion import figures as f
from jaxcache.service.ingestion import groups, stacked
from reports_support import run
from test_service_aggregates import _ingested


def _figures(rng: random.Random, keys: list[str]) -> f.Figures:
    n = len(keys)
    pick = lambda *values: [rng.choice(values) for _ in range(n)]  # noqa: E731
    return f.Figures(
        list(keys), [k.rsplit("-", 1)[0] for k in keys], pick(HIT, COMPILED, WRITE), pick(0, 0, 1, 3),
        pick(0, 1), pick(0, 0, 1), pick(None, None, "a reason", "b reason"), pick(None, 0.0, 1.5, 2.25),
        [rng.uniform(0, 1) for _ in keys], [rng.uniform(-1, 3) for _ in keys], [rng.uniform(0, 2) for _ in keys],
        pick(None, 100, 4096), pick(0.0, 1000.0, 1000.5, 1002.0), pick(0.0, 1001.0, 1003.0))


def _side(members: list[tuple[int, f.Figures, float, float]]) -> stacked.Side:
    side = stacked._side(members)
    assert side is not None
    return side


def _parts(side: stacked.Side, j: int) -> list[groups.Part]:
    return [(tuple(zip(*(getattr(fig, name) for name in f.Figures.__struct_fields__), strict=True))[j],
             int(p), float(u), float(s))
            for fig, p, u, s in zip(side.figures, side.processes, side.updated, side.started, strict=True)]


@pytest.mark.parametrize("seed", range(20))
def test_summaries_equal_build(seed):
    rng = random.Random(seed)
    keys = [f"jit_f{i % 3}-{i:064x}" for i in range(rng.randrange(1, 9))]
    members = [(index, _figures(rng, keys), rng.choice([5.0, 7.0]), rng.choice([900.0, 950.0]))
               for index in rng.sample(range(10), rng.randrange(1, 6))]
    side = _side(members)
    for kind in (JOB, WARMUP):
        for j, summary in enumerate(stacked._summaries(kind, side)):
            built = groups.build(kind, _parts(side, j))
            assert built is not None and summary.keys() == built.keys()
            assert summary == pytest.approx(built), (kind, j)  # exact but for the order floats are summed in
            assert all(type(summary[n]) is type(built[n]) or built[n] is None for n in built), (kind, j)


def _rewritten(rng: random.Random, fig: f.Figures) -> f.Figures:
    """The same process's next record: the same use of each key, later and with more hits."""
    more = [h + rng.randrange(0, 3) if h else 0 for h in fig.hits]
    return msgspec.structs.replace(fig, hits=more, last_at=[t + rng.uniform(0, 5) if t else t for t in fig.last_at],
                                   retrieval_s=[r + 1 for r in fig.retrieval_s])


@pytest.mark.parametrize("seed", range(10))
def test_only_usual_rewrites_take_the_fast_way(seed):
    rng = random.Random(seed)
    keys = [f"jit_f{i}-{i:064x}" for i in range(5)]
    old = [(index, _figures(rng, keys), 5.0, 900.0) for index in range(4)]
    new = [(index, _rewritten(rng, fig), 6.0, started) for index, fig, _, started in old]
    before, after = _side(old), _side(new)
    assert stacked._rewrites(before, after)
    for j in range(len(keys)):
        row = groups.build(JOB, _parts(before, j))
        assert all(groups.covered(row, JOB, o, n) for o, n in zip(_parts(before, j), _parts(after, j), strict=True))
    fig = new[1][1]
    changes = {"first_at": [t + 1 for t in fig.first_at], "functions": ["jit_g"] * 5, "events": [HIT] * 5,
               "reasons": ["another"] * 5, "size_bytes": [1] * 5, "writes": [w + 1 for w in fig.writes],
               "compile_s": [9.0] * 5, "last_at": [-1.0] * 5, "hits": [-1] * 5}
    for name, values in changes.items():
        bad = [*new[:1], (1, msgspec.structs.replace(fig, **{name: values}), 6.0, 900.0), *new[2:]]
        assert not stacked._rewrites(before, _side(bad)), name
    for bad_process in ((1, fig, 4.0, 900.0), (1, fig, 6.0, 901.0)):  # older run row; another start
        assert not stacked._rewrites(before, _side([*new[:1], bad_process, *new[2:]]))
    assert not stacked._rewrites(before, _side(new[:3])), "a process with old parts and none in the batch"
    assert not stacked._rewrites(before, _side([(i, msgspec.structs.replace(x, keys=x.keys[:4], **{
        n: getattr(x, n)[:4] for n in f.Figures.__struct_fields__ if n != "keys"}), u, s) for i, x, u, s in new]))
    mixed = [(0, new[0][1], 6.0, 900.0), (1, msgspec.structs.replace(fig, keys=list(reversed(fig.keys))), 6.0, 900.0)]
    assert stacked._side(mixed) is None, "processes that report other keys (or another order) are not stacked"
    nothing = _side([(index, f.EMPTY, 5.0, 900.0) for index in range(4)])
    assert stacked._rewrites(nothing, after), "records before any compile: nothing to cover"


def _spmd_reports(rng: random.Random, pool: list[str], now: float) -> list:
    """A job's processes (and a warm-up's) reporting the same keys in the same order, record after record: the
    usual rewrites, with now and then one that is not (another first use), a new process, a late key."""
    out = []
    for run_id, kind in (("j1", "job"), ("w1", "warmup"), ("j2", "job")):
        keys = rng.sample(pool, 5)
        start = now - rng.uniform(0, 3600)
        procs = {}
        for index in range(6):  # each process's first record: before any compile
            out.append((run(f"job-{run_id}", run_id, [], at=start - 30, process_index=index, process_count=6,
                            kind=kind), False))
        for index in range(6):
            usage = [rng.choice([KeyUsage(key=k, event=HIT, function=k.rsplit("-", 1)[0], hits=1, first_at=start + 1,
                                          last_at=start + 2, retrieval_s=0.1, saved_s=1.0),
                                 KeyUsage(key=k, event=WRITE, function=k.rsplit("-", 1)[0], compiles=1, writes=1,
                                          compile_s=rng.choice([None, 2.0, 3.5]), first_at=start + index),
                                 KeyUsage(key=k, event=COMPILED, function=k.rsplit("-", 1)[0], compiles=1,
                                          compile_s=1.0, reason="only process 0 writes the cache",
                                          first_at=start + 3)]) for k in keys]
            procs[index] = run(f"job-{run_id}", run_id, usage, at=start, process_index=index, process_count=6,
                               kind=kind)
        for step in range(1, 5):
            for index, rec in list(procs.items()):
                grown = [msgspec.structs.replace(u, hits=u.hits + step if u.hits else 0,
                                                 last_at=u.last_at + step if u.hits else u.last_at,
                                                 retrieval_s=u.retrieval_s + step * 0.1) for u in rec.keys]
                if rng.random() < 0.1:  # not the usual rewrite: another first use
                    grown[0] = msgspec.structs.replace(grown[0], first_at=grown[0].first_at + 7)
                procs[index] = msgspec.structs.replace(rec, keys=grown, updated_at=rec.updated_at + 10)
                out.append((procs[index], False))
    return out


def _close(a: tuple, b: tuple) -> bool:
    """Equal, floats but for the order they were summed in."""
    return len(a) == len(b) and all(x == pytest.approx(y) if isinstance(y, float) else x == y
                                    for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("seed", range(2))
def test_the_fast_way_stores_what_the_tuple_way_stores(request, tmp_path, cache_copy, keys, seed, monkeypatch):
    from sqlalchemy import select

    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import KeyStatsRow, UsageRow
    from jaxcache.service.tasks.rescan import rescan as do_rescan
    from jaxcache.storage import open_storage

    rng = random.Random(seed)
    pool = keys["all"][:5] + [f"jit_ghost{i}-{'c' * 64}" for i in range(3)]
    reports = _spmd_reports(rng, pool, time.time())
    sizes = [rng.randrange(2, 9) for _ in range(len(reports))]
    stacks, real = [], stacked._summaries
    monkeypatch.setattr(stacked, "_summaries", lambda kind, side: stacks.append(kind) or real(kind, side))
    snapshots = []
    for way in ("fast", "tuples"):
        if way == "tuples":
            monkeypatch.setattr(stacked, "_side", lambda members: None)
        catalog = Catalog(f"sqlite:///{tmp_path / way}.sqlite")
        do_rescan(catalog, "demo", open_storage(str(cache_copy)))
        _ingested(catalog, reports, iter(sizes))
        with catalog.reader() as conn:
            columns = [c for c in UsageRow.__table__.columns if c.name not in ("parts", "program")]
            rows = {tuple(r[:5]): tuple(r[5:]) for r in conn.execute(select(*columns))}
            stats = {r[0]: tuple(r[1:]) for r in conn.execute(select(*KeyStatsRow.__table__.columns)).all()}
        snapshots.append((rows, stats))
        catalog.dispose()
        if way == "fast":
            assert stacks, "no batch took the fast way"
            taken = len(stacks)
    assert len(stacks) == taken, "the tuple way stacked nothing"
    (fast_rows, fast_stats), (rows, stats) = snapshots
    assert fast_rows.keys() == rows.keys() and fast_stats.keys() == stats.keys()
    for ident, values in rows.items():
        assert _close(fast_rows[ident], values), (ident, fast_rows[ident], values)
    for key, values in stats.items():
        assert _close(fast_stats[key], values), (key, fast_stats[key], values)
    assert {ident[1] for ident in rows} == {"j1", "w1", "j2"}


@pytest.mark.parametrize("seed", range(5))
def test_weighing_a_record_at_once_is_saved_of_each_key(seed):
    from jaxcache.service.ingestion.changes import Change, weigh

    rng = random.Random(seed)
    keys = [f"jit_f{i}-{i:064x}" for i in range(12)]
    fig = _figures(rng, keys)
    fig.hits[0], fig.retrieval_s[0] = 2, 100.0  # the catalog's measure saves nothing: JAX's own figure counts
    measure = {k: rng.choice([None, 0.0, 0.5, 30.0]) for k in keys[:9]}
    weigh(Change(None, run("job", "r", []), fig, None), measure)  # type: ignore[arg-type]
    assert fig.saved_s == [f.saved_of(h, r, j, measure.get(k)) for k, h, r, j in
                           zip(fig.keys, fig.hits, fig.retrieval_s, fig.jax_saved_s, strict=True)]
    assert any(s == 0.0 for s in fig.saved_s) and any(s > 0 for s in fig.saved_s)
