"""Run records' per-key aggregates: kept as differences, one record at a time or in batches (as the service's
writer takes POSTs), they equal a recomputation from every row; a batch stores what its records one at a time
store."""

from __future__ import annotations

import hashlib
import time
from collections import Counter

import msgspec
import pytest

from jaxcache.records import RunRecord
from reports_support import DAY, NEW, OLD, compiled, hit, run, write


def _random_reports(rng, pool: list[str], now: float) -> list[tuple[RunRecord, bool]]:
    """Reports as processes send them, in order, each with whether it is an older version of one sent before
    (stale): processes rewriting growing totals, late writers, keys without entries, warm-ups and their verify
    runs."""
    state: dict[tuple[str, int], RunRecord] = {}
    out: list[tuple[RunRecord, bool]] = []
    for step in range(40):
        run_id, index = rng.choice(["a", "b", "c"]), rng.randrange(3)
        rec = state.get((run_id, index))
        if rec is None or rng.random() < 0.1:
            start = now - rng.uniform(0, 5 * DAY)
            rec = run(f"job-{run_id}", run_id, [], at=start, process_index=index, process_count=3,
                      jaxlib=rng.choice([NEW, OLD]), kind=rng.choice(["job", "job", "warmup", "warmup-verify"]))
        else:
            rec = msgspec.structs.replace(rec, keys=[msgspec.structs.replace(u) for u in rec.keys])
        for _ in range(rng.randrange(1, 4)):
            key = rng.choice(pool)
            u = next((u for u in rec.keys if u.key == key), None)
            at = rec.started_at + rng.uniform(0, 3600)
            if u is None:
                kind = rng.choice(["hit", "write", "compiled"])
                u = {"hit": hit(key, 1, at, retrieval_s=rng.uniform(0, 1), saved_s=rng.uniform(-1, 3)),
                     "write": write(key, rng.choice([None, rng.uniform(0, 20)]), at),
                     "compiled": compiled(key, rng.uniform(0, 5), at)}[kind]
                rec.keys.append(u)
            elif u.hits:
                u.hits += rng.randrange(1, 3)
                u.retrieval_s += rng.uniform(0, 1)
                u.last_at = max(u.last_at, at)
        rec.updated_at = rec.started_at + 10 * step
        if rng.random() < 0.15 and (run_id, index) in state:
            older = state[(run_id, index)]
            out.append((msgspec.structs.replace(older, updated_at=older.updated_at - 1, keys=older.keys[:1]), True))
        out.append((rec, False))
        state[(run_id, index)] = rec
    return out


def _ingested(catalog, reports: list[tuple[RunRecord, bool]], batch_sizes,
              on_misses=None) -> dict[tuple[str, int], RunRecord]:
    """Ingest ``reports`` one at a time (``batch_sizes`` None) or accepted into the inbox in batches of the sizes it
    yields, each batch drained at once (``on_misses``: told of misses explained); the versions the catalog holds, by
    process. Older versions must come back stale."""
    from jaxcache.service.reports.ingest.queue import accept, drain, ingest

    held: dict[tuple[str, int], RunRecord] = {}
    i = 0
    while i < len(reports):
        n = 1 if batch_sizes is None else next(batch_sizes)
        chunk = reports[i : i + n]
        i += n
        if batch_sizes is None:
            results = [ingest(catalog, "demo", chunk[0][0], on_misses=on_misses)]
        else:
            results = [accept(catalog, "demo", r, r.to_json()) for r, _ in chunk]
            drain(catalog, "demo", on_misses=on_misses)
        for (rec, older), result in zip(chunk, results, strict=True):
            if older:
                assert result.stale
            elif not result.stale:
                held[(rec.run_id, rec.process_index)] = rec
    return held


@pytest.mark.parametrize(("seed", "backend", "batched"),
                         [(seed, "sqlite", False) for seed in range(6)] + [(seed, "sqlite", True) for seed in range(4)]
                         + [(0, "postgresql", False), (1, "postgresql", False), (0, "postgresql", True)])
def test_incremental_aggregates_equal_a_full_recompute(request, tmp_path, cache_copy, keys, seed, backend, batched):
    """Random reports (processes rewriting growing totals, late writers, older versions, keys without entries,
    warm-ups and their verify runs, whose hits are not use), one at a time or in batches as POSTs are (several
    versions of one process's record in one batch too): the aggregates kept as differences equal a recomputation
    from every row, and count only jobs' hits."""
    import itertools
    import random

    from sqlalchemy import select

    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import EntryRow, KeyStatsRow, RunRow, UsageRow
    from jaxcache.service.reports.ingest.usage import refresh
    from jaxcache.service.rounds import rescan as do_rescan
    from jaxcache.storage import open_storage

    rng = random.Random(seed)
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'c.sqlite'}"
    catalog = Catalog(url)
    do_rescan(catalog, "demo", open_storage(str(cache_copy)))
    pool = keys["all"][:5] + [f"jit_ghost{i}-{'c' * 64}" for i in range(3)]
    reports = _random_reports(rng, pool, time.time())
    sizes = (rng.randrange(1, 9) for _ in itertools.count()) if batched else None
    ingested = _ingested(catalog, reports, sizes)

    def snapshot():
        with catalog.reader() as conn:
            stats = {r[0]: tuple(r[1:]) for r in conn.execute(select(
                KeyStatsRow.key, KeyStatsRow.hits, KeyStatsRow.last_hit_s, KeyStatsRow.saved_s, KeyStatsRow.writer_run,
                KeyStatsRow.writer_process, KeyStatsRow.writer_jaxlib, KeyStatsRow.writer_compile_s))}
            columns = [c for c in UsageRow.__table__.columns if c.name not in (
                "parts", "program", "cause", "differs", "nearest", "fix", "counted")]
            rows = {tuple(r[:5]): tuple(r[5:]) for r in conn.execute(select(*columns))}
            runs = {tuple(r[:2]): tuple(r[2:]) for r in conn.execute(select(
                RunRow.run_id, RunRow.process_index, RunRow.hits, RunRow.compiles, RunRow.writes, RunRow.saved_s))}
            entries = {r[0]: tuple(r[1:]) for r in conn.execute(select(
                EntryRow.key, EntryRow.hits, EntryRow.saved_s, EntryRow.last_used_s, EntryRow.writer_run))}
        return stats, rows, entries, runs

    kept = snapshot()
    with catalog.session() as s:
        refresh(s.connection(), "demo", pool)
    fresh = snapshot()
    assert all(a.keys() == b.keys() for a, b in zip(kept, fresh, strict=True))
    for a, b in zip(kept, fresh, strict=True):
        for k in b:
            assert a[k] == pytest.approx(b[k]), (k, a[k], b[k])
    jobs_hits = {key: sum(u.hits for r in ingested.values() if r.kind == "job" for u in r.keys if u.key == key)
                 for key in fresh[0]}
    assert {key: v[0] for key, v in fresh[0].items()} == jobs_hits
    assert any(r.kind != "job" and any(u.hits for u in r.keys) for r in ingested.values()), "no warm-up hit drawn"
    catalog.dispose()


@pytest.mark.parametrize(("seed", "backend"), [(0, "sqlite"), (1, "sqlite"), (2, "sqlite"), (0, "postgresql")])
def test_a_batch_stores_what_its_records_one_at_a_time_store(request, tmp_path, cache_copy, keys, seed, backend):
    """The same reports into two catalogs, one record a transaction and in batches (as the service's writer
    takes POSTs): the same runs, usage rows, aggregates, entry copies and digests; every job's miss explained
    and counted once (a batch explains its misses at its end, so with more of the history)."""
    import itertools
    import random

    from sqlalchemy import select

    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import AttestationRow, EntryRow, KeyStatsRow, RunRow, UsageRow
    from jaxcache.service.rounds import rescan as do_rescan
    from jaxcache.storage import open_storage

    rng = random.Random(seed)
    pool = keys["all"][:5] + [f"jit_ghost{i}-{'c' * 64}" for i in range(3)]
    reports = _random_reports(rng, pool, time.time())
    # Some digests, so that batches record attestations too.
    reports = [(msgspec.structs.replace(r, keys=[msgspec.structs.replace(u, sha256=hashlib.sha256(u.key.encode())
                                                                          .hexdigest()) if u.event == "write" else u
                                                  for u in r.keys]), older) for r, older in reports]
    counted: dict[str, Counter] = {"one": Counter(), "batched": Counter()}
    snapshots = {}
    for mode in ("one", "batched"):
        if backend == "postgresql":
            url = request.getfixturevalue("postgres").create_database()
        else:
            url = f"sqlite:///{tmp_path / f'{mode}.sqlite'}"
        catalog = Catalog(url)
        do_rescan(catalog, "demo", open_storage(str(cache_copy)), on_misses=counted[mode].update)
        counted[mode].clear()  # (the rescan read no records)
        sizes = (rng.randrange(2, 9) for _ in itertools.count()) if mode == "batched" else None
        _ingested(catalog, reports, sizes, on_misses=counted[mode].update)
        with catalog.reader() as conn:
            usage = select(*(c for c in UsageRow.__table__.columns if c.name not in ("cause", "differs", "nearest",
                                                                                        "fix")))
            snapshots[mode] = {
                "runs": sorted(tuple(r) for r in conn.execute(select(
                    RunRow.run_id, RunRow.process_index, RunRow.updated_s, RunRow.keys, RunRow.job, RunRow.kind))),
                "usage": sorted(tuple(r) for r in conn.execute(usage)),
                "stats": sorted(tuple(r) for r in conn.execute(select(KeyStatsRow.__table__))),
                "entries": sorted(tuple(r) for r in conn.execute(select(
                    EntryRow.key, EntryRow.hits, EntryRow.saved_s, EntryRow.last_used_s, EntryRow.writer_run))),
                "digests": sorted(tuple(r) for r in conn.execute(select(
                    AttestationRow.key, AttestationRow.sha256, AttestationRow.source))),
                "unexplained": conn.execute(select(UsageRow.key).where(
                    UsageRow.kind == "job", UsageRow.event.in_(["write", "compiled"]), UsageRow.cause.is_(None))).all(),
                "misses": conn.execute(select(UsageRow.key).where(
                    UsageRow.kind == "job", UsageRow.event.in_(["write", "compiled"]))).all(),
            }
        catalog.dispose()
    one, batched = snapshots["one"], snapshots["batched"]
    for part in ("runs", "usage", "stats", "entries", "digests"):
        assert len(one[part]) == len(batched[part]), part
        for a, b in zip(one[part], batched[part], strict=True):
            assert a == pytest.approx(b), (part, a, b)
    assert one["misses"] and not one["unexplained"] and not batched["unexplained"]
    # Each miss still stored was counted once in both; one at a time also counts a miss that a later version of
    # its record, in the same batch, no longer has.
    assert len(one["misses"]) <= sum(counted["batched"].values()) <= sum(counted["one"].values())


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_pass_after_one_rolled_back_still_keeps_its_differences(request, tmp_path, backend):
    """A pass whose transaction rolls back (a record the catalog refuses) takes the pass's temporary table with
    it: the next pass, on the same connection, makes it again."""
    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.reports.ingest import usage

    url = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'c.sqlite'}"
    catalog = Catalog(url)
    with pytest.raises(RuntimeError), catalog.writing("demo") as s:
        usage.usage_before(s.connection(), "demo", [("r1", 0)])
        raise RuntimeError("the catalog refused a record")
    with catalog.writing("demo") as s:
        usage.usage_before(s.connection(), "demo", [("r1", 0)])
        assert usage.usage_after(s.connection(), "demo", [("r1", 0)]) == {}
    catalog.dispose()
