"""A job's working set read from a root's records (``jaxcache.working_set.from_root``) and from the job's index
(``jaxcache.working_set_index``, which process 0 of each run and each warm-up update as they write their records):
which runs and warm-ups count, in which order their keys come, and what is left out, the same either way. Records
are written as the client and warm-up write them; no JAX is needed to say which keys they name."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import pytest

from jaxcache import coverage, records, working_set_index
from jaxcache.errors import InvalidInputError
from jaxcache.storage import LocalStorage
from jaxcache.working_set import Wanted, WorkingSet, from_root
from working_set_support import CPU4, CPU8, NOW, OLD, key, put_run, put_warmup, use


@pytest.fixture
def root(tmp_path) -> LocalStorage:
    return LocalStorage(str(tmp_path))


def from_the_index(storage: LocalStorage, job: str, wanted: Wanted, **kwargs: Any) -> WorkingSet:
    """The set from the job's index, as built by the writers of the records now in ``storage`` (each merging its own
    at exit: runs with working_set_index.add_run, warm-ups with add_warmup), in the order they ended."""
    written = [i.name for i in storage.iter_objects(records.RECORDS_DIR + "/", recursive=True)]
    found: list[tuple[float, Callable[[], None]]] = []
    for name in written:
        data = storage.read(name)
        assert data is not None
        try:
            if name.startswith(records.RUNS_PREFIX):
                run = records.parse(data)
                found.append((run.updated_at, lambda run=run: working_set_index.add_run(storage, run)))
            elif name.startswith(coverage.WARMUPS_PREFIX):
                warm = coverage.parse(data)
                found.append((warm.finished_at, lambda warm=warm: working_set_index.add_warmup(storage, warm)))
        except InvalidInputError:
            continue  # a writer that wrote that wrote no index either
    for _at, add in sorted(found, key=lambda f: f[0]):
        add()
    return working_set_index.from_index(storage, job, wanted, **kwargs) or WorkingSet(job=job)


@pytest.fixture(params=["records", "index"])
def read(request) -> Callable[..., WorkingSet]:
    """The set as ``from_root`` reads it from the records, and as a start reads it from the job's index."""
    return from_root if request.param == "records" else from_the_index


def test_the_newest_matching_runs_give_their_hits_and_writes_in_order_of_first_use(root, read):
    put_run(root, "r3", CPU8, [use(3, at=5), use(1, records.WRITE, at=1), use(9, records.COMPILED, at=0)])
    put_run(root, "r2", CPU8, [use(2), use(1)], ago_s=3600)
    put_run(root, "r1", CPU8, [use(7)], ago_s=7200)
    got = read(root, "train", Wanted(jaxlib="0.10.2"), runs=2, now=NOW)
    assert got.runs == ["r3", "r2"]
    assert got.keys == [key(1), key(3), key(2)]  # key 9 was only compiled: nothing stored to fetch
    assert got.sha256 == {key(1): f"{1:064x}"}
    assert got.fingerprint == CPU8


def test_unknown_fields_come_from_the_newest_matching_run_so_layouts_never_mix(root, read):
    put_run(root, "new4", CPU4, [use(4)])
    put_run(root, "old8", CPU8, [use(8)], ago_s=60)
    assert read(root, "train", Wanted(jaxlib="0.10.2"), now=NOW).keys == [key(4)]
    assert read(root, "train", Wanted.of(CPU8), now=NOW).keys == [key(8)]
    assert read(root, "train", Wanted.of(OLD), now=NOW).keys == []


def test_other_jobs_warmups_own_records_other_processes_and_old_days_are_left_out(root, read):
    put_run(root, "other", CPU8, [use(1)], job="eval")
    put_run(root, "w", CPU8, [use(2)], kind=records.WARMUP)
    put_run(root, "p1", CPU8, [use(3)], process=1)
    put_run(root, "ancient", CPU8, [use(4)], ago_s=30 * 86400)
    put_run(root, "mine", CPU8, [use(5)], ago_s=86400)
    assert read(root, "train", Wanted.of(CPU8), now=NOW).keys == [key(5)]


def test_warmups_add_what_their_coverage_says_is_there(root, read):
    put_run(root, "r", CPU8, [use(1)])
    put_warmup(root, "wu", CPU8, {2: coverage.WRITTEN, 3: coverage.PRESENT, 4: coverage.NOT_WRITTEN})
    put_warmup(root, "wu4", CPU4, {5: coverage.WRITTEN})
    put_warmup(root, "wu-other", CPU8, {6: coverage.WRITTEN}, job="eval")
    got = read(root, "train", Wanted(), now=NOW)
    assert got.keys == [key(1), key(2), key(3)]
    assert got.warmups == ["wu"]


def test_unreadable_records_are_passed_over(root, read):
    put_run(root, "good", CPU8, [use(1)], ago_s=10)
    bad = records.record_name("bad", 0, NOW)
    root.write_atomic(bad, b"{not json")
    assert read(root, "train", Wanted(), now=NOW).keys == [key(1)]


def test_the_set_round_trips_as_builtins_and_refuses_what_is_not_one(root, read):
    put_run(root, "r", CPU8, [use(1, records.WRITE), use(2)])
    got = read(root, "train", Wanted(), now=NOW)
    assert WorkingSet.from_builtins(got.to_builtins()) == got
    with pytest.raises(InvalidInputError, match="not a working set"):
        WorkingSet.from_builtins({"job": "train", "keys": ["../../etc/passwd"]})


def test_a_warmup_alone_gives_its_fingerprints_set(root, read):
    put_warmup(root, "wu4", CPU4, {4: coverage.WRITTEN}, ago_s=60)
    put_warmup(root, "wu8", CPU8, {8: coverage.PRESENT})
    got = read(root, "train", Wanted(jaxlib="0.10.2"), now=NOW)
    assert got.keys == [key(8)] and got.warmups == ["wu8"] and got.fingerprint == CPU8


def test_no_index_is_no_set_and_a_start_reads_nothing_more(root):
    put_run(root, "r", CPU8, [use(1)])  # a record of an older client, which wrote no index
    root.reads = 0
    assert working_set_index.from_index(root, "train", Wanted(), now=NOW) is None
    assert root.reads == 1  # the index's one read: no listing, no record


def test_the_index_stays_bounded(root):
    for n in range(working_set_index.MAX_GROUPS + 2):  # as many device layouts, oldest first
        fp = msgspec.structs.replace(CPU8, device_count=n + 1)
        working_set_index.add_run(root, put_run(root, f"r{n}", fp, [use(n)], ago_s=100 - n))
        for w in range(working_set_index.MAX_WARMUPS + 1):
            put_warmup(root, f"w{n}-{w}", fp, {n: coverage.PRESENT}, ago_s=100 - n - w / 100)
    for info in list(root.iter_objects(coverage.WARMUPS_PREFIX)):
        data = root.read(info.name)
        assert data is not None
        working_set_index.add_warmup(root, coverage.parse(data))
    index = working_set_index.read_index(root, "train")
    assert index is not None
    assert [g.fingerprint.device_count for g in index.groups] == list(range(working_set_index.MAX_GROUPS + 2, 2, -1))
    assert all(len(g.warmups) == working_set_index.MAX_WARMUPS for g in index.groups)
    # One run using more keys than the index holds keeps those it used first, within the bound.
    many = [use(n, records.WRITE, at=n / 1e6) for n in range(45_000)]  # about 10 MB of keys and digests
    working_set_index.add_run(root, put_run(root, "huge", CPU8, many))
    data = root.read(working_set_index.index_name("train"))
    assert data is not None and len(data) <= working_set_index.MAX_INDEX_BYTES
    got = working_set_index.from_index(root, "train", Wanted.of(CPU8), now=NOW)
    assert got is not None and got.runs == ["huge"] and 20_000 < len(got.keys) < 45_000
    assert got.keys == [key(n) for n in range(len(got.keys))]


def test_writers_of_one_jobs_index_at_once_lose_no_update(root):
    layouts = [msgspec.structs.replace(CPU8, device_count=n) for n in range(1, 7)]
    runs = [put_run(root, f"r{n}", fp, [use(n)]) for n, fp in enumerate(layouts)]
    with ThreadPoolExecutor(len(runs)) as pool:
        list(pool.map(lambda run: working_set_index.add_run(root, run), runs))
    index = working_set_index.read_index(root, "train")
    assert index is not None and sorted(g.runs[0].id for g in index.groups) == sorted(r.run_id for r in runs)


def test_an_index_that_is_not_one_is_refused_and_replaced_by_the_next_writer(root):
    name = working_set_index.index_name("train")
    root.write_atomic(name, b"{not an index")
    with pytest.raises(InvalidInputError, match="working-set index"):
        working_set_index.from_index(root, "train", Wanted(), now=NOW)
    working_set_index.add_run(root, put_run(root, "r", CPU8, [use(1)]))
    got = working_set_index.from_index(root, "train", Wanted(), now=NOW)
    assert got is not None and got.keys == [key(1)]
    assert working_set_index.index_name("train step #2") == ".jaxcache/working-sets/train%20step%20%232.json"
