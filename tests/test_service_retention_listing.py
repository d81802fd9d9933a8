"""Rescans do not list run records already ingested and unchanged: a process lists all of ``.jaxcache/runs/`` on its
first rescan of a cache and once a day; otherwise only recent days, days that changed at their last listing, and
days of runs still running. Counted on a wrapped storage object, over a local root and each object store."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from jaxcache import records
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import CacheRow, KeyStatsRow, RecordFileRow
from jaxcache.service.reports.records import runfiles
from jaxcache.service.rounds import rescan
from jaxcache.storage import Storage, open_storage
from reports_support import DAY, hit, run, write
from store_servers import BUCKETS, raw_put

KEY = "jit_f-" + "a" * 64
OTHER = "jit_g-" + "b" * 64
AGO = (9, 5, 3, 2)  # days of old runs: all settle
RUNS = records.RUNS_PREFIX


class Counting:
    """A storage whose listings are noted (prefix, recursive); everything else is the real one's."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.listed: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def iter_objects(self, prefix: str = "", *, recursive: bool = False):
        self.listed.append(prefix)
        return self.inner.iter_objects(prefix, recursive=recursive)

    def runs_listed(self) -> set[str]:
        out = {p for p in self.listed if p.startswith(RUNS)}
        self.listed.clear()
        return out


def _day(offset_d: float) -> str:
    return records.day_of(time.time() + offset_d * DAY)


def _recent() -> set[str]:
    return {f"{RUNS}{_day(d)}/" for d in (-1, 0, 1)}


class Root:
    """Where records go: a local directory or a bucket's prefix."""

    def __init__(self, url: str, put) -> None:
        self.url, self.put = url, put


@pytest.fixture(params=["local", *BUCKETS])
def root(request, tmp_path) -> Root:
    if request.param == "local":
        base = tmp_path / "cache"
        base.mkdir()

        def put_local(record: records.RunRecord) -> None:
            path = base / record.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(record.to_json())

        return Root(str(base), put_local)
    url = f"{request.param}://{request.getfixturevalue(BUCKETS[request.param])}/jc"
    return Root(url, lambda record: raw_put(url, record.name, record.to_json()))


def _record(run_id: str, ago_d: float, hits: int = 1, *, final: bool = True, updated_ago_d: float | None = None):
    """A job's record, started ``ago_d`` days ago (its day folder) and last updated ``updated_ago_d`` ago."""
    now = time.time()
    started = now - ago_d * DAY
    updated = started + 60 if updated_ago_d is None else now - updated_ago_d * DAY
    r = run("train", run_id, [write(KEY, 2.0, started + 1), hit(OTHER, hits, updated)], at=updated)
    r.started_at, r.final = started, final
    return r


def _catalog(tmp_path: Path, url: str) -> Catalog:
    """A catalog on one file, as a fresh process of the service opens it."""
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.sqlite'}")
    with catalog.session() as s:
        if s.get(CacheRow, "demo") is None:
            s.add(CacheRow(name="demo", url=url))
    return catalog


def _hits(catalog: Catalog, key: str = OTHER) -> int:
    with catalog.reader() as conn:
        return conn.scalar(select(KeyStatsRow.hits).where(KeyStatsRow.key == key)) or 0


def test_a_later_rescan_lists_only_days_that_may_change(tmp_path, root):
    for i, ago in enumerate(AGO):
        root.put(_record(f"old{i}", ago))
    root.put(_record("today", 0.001))
    storage = Counting(open_storage(root.url))
    first = _catalog(tmp_path, root.url)
    assert rescan(first, "demo", storage).records_ingested == len(AGO) + 1
    assert storage.runs_listed() == {RUNS}
    # The same process lists each day folder once more (each changed at its first listing), then only recent ones.
    assert rescan(first, "demo", storage).records_ingested == 0
    assert storage.runs_listed() == {f"{RUNS}{_day(-a)}/" for a in AGO} | _recent()
    assert rescan(first, "demo", storage).records_ingested == 0
    assert storage.runs_listed() == _recent()
    first.dispose()

    # A process started later lists everything once; what it found unchanged is settled from then on.
    later = _catalog(tmp_path, root.url)
    assert rescan(later, "demo", storage).records_ingested == 0
    assert storage.runs_listed() == {RUNS}
    assert rescan(later, "demo", storage).records_ingested == 0
    assert storage.runs_listed() == _recent()
    # A record rewritten in today's folder (running totals) is still read.
    before = _hits(later)
    root.put(_record("today", 0.001, hits=5))
    assert rescan(later, "demo", storage).records_ingested == 1
    assert _hits(later) == before + 4
    assert storage.runs_listed() == _recent()
    later.dispose()


def test_a_late_record_in_a_settled_day_waits_for_the_daily_full_listing(tmp_path, root):
    root.put(_record("old", 5))
    storage = Counting(open_storage(root.url))
    catalog = _catalog(tmp_path, root.url)
    rescan(catalog, "demo", storage)
    rescan(catalog, "demo", storage)  # its day is quiet now
    storage.runs_listed()
    # A process of a run started five days ago writes its record only at exit (as on gs:// roots).
    root.put(_record("late", 5))
    assert rescan(catalog, "demo", storage).records_ingested == 0
    assert storage.runs_listed() == _recent()
    # The rescan's scan of the run records a day later: the daily full listing reads it.
    a_day_later = time.time() + runfiles.FULL_LISTING_S
    assert runfiles.scan_records(catalog, "demo", storage, now=a_day_later).ingested == 1
    assert storage.runs_listed() == {RUNS}
    catalog.dispose()


def test_a_running_process_keeps_its_start_day_listed(tmp_path, root):
    # A job started four days ago and still running rewrites its record in that day's folder: however its
    # rewrites fall between rescans, the folder is listed while the run is not final and was updated lately.
    root.put(_record("long", 4, final=False, updated_ago_d=0.01))
    storage = Counting(open_storage(root.url))
    catalog = _catalog(tmp_path, root.url)
    for _ in range(3):
        rescan(catalog, "demo", storage)
    assert storage.runs_listed() == {RUNS} | _recent() | {f"{RUNS}{_day(-4)}/"}
    assert rescan(catalog, "demo", storage).records_ingested == 0
    assert f"{RUNS}{_day(-4)}/" in storage.runs_listed()
    root.put(_record("long", 4, hits=3, final=True, updated_ago_d=0))
    assert rescan(catalog, "demo", storage).records_ingested == 1
    assert _hits(catalog) == 3
    # Final now: the folder is listed once more (it changed), then settles.
    rescan(catalog, "demo", storage)
    storage.runs_listed()
    rescan(catalog, "demo", storage)
    assert storage.runs_listed() == _recent()
    catalog.dispose()


def test_vanished_records_are_judged_only_in_the_days_listed(tmp_path):
    # A file deleted from a settled day is not seen gone until the next full listing, and a partial listing never
    # takes the records of days it did not list for gone.
    base = tmp_path / "cache"
    base.mkdir()
    old = _record("old", 6)
    (base / old.name).parent.mkdir(parents=True)
    (base / old.name).write_bytes(old.to_json())
    storage = open_storage(str(base))
    catalog = _catalog(tmp_path, storage.url)
    for _ in range(3):
        rescan(catalog, "demo", storage)

    def rows() -> set[str]:
        with catalog.reader() as conn:
            return set(conn.scalars(select(RecordFileRow.name)))

    assert rows() == {old.name}
    (base / old.name).unlink()
    rescan(catalog, "demo", storage)
    assert rows() == {old.name}  # not listed: not judged
    runfiles.listings(catalog).clear()
    rescan(catalog, "demo", storage)
    assert rows() == set()
    catalog.dispose()
