"""The fast paths of the service answer as the slow ones would: the periodic rescan's in-memory snapshot, listing
pages planned as index ranges, and the page cache of listings."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import time
import tracemalloc
from pathlib import Path

import pytest
from sqlalchemy import delete, select
from sqlalchemy.dialects import sqlite as sqlite_dialect

from gc_support import full_collections
from jaxcache import entry as fmt
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import CacheRow, EntryRow
from jaxcache.service.entries import queries as listing
from jaxcache.service.rescan import scan as rescan_mod
from jaxcache.service.rescan import snapshots
from jaxcache.storage import open_storage
from store_servers import put_dir

NEW_KEY = "jit_copied-" + "ab" * 32


def _rows(catalog: Catalog, cache: str) -> set[tuple]:
    with catalog.session() as s:
        return {tuple(r) for r in s.execute(select(
            EntryRow.key, EntryRow.kind, EntryRow.size_bytes, EntryRow.created_s, EntryRow.seen_used_s,
            EntryRow.has_atime, EntryRow.status).where(EntryRow.cache == cache))}


def _catalog(url: str, root: Path, snapshot_dir: Path | None = None) -> Catalog:
    catalog = Catalog(url, snapshot_dir=snapshot_dir)
    with catalog.session() as s:
        if s.get(CacheRow, "c") is None:
            s.add(CacheRow(name="c", url=str(root)))
    return catalog


def _fresh_rows(tmp_path: Path, root: Path) -> set[tuple]:
    """What one full rescan into an empty catalog makes of the root: what every faster rescan must match."""
    db = tmp_path / f"fresh-{time.monotonic_ns()}.sqlite"
    catalog = _catalog(f"sqlite:///{db}", root)
    rescan_mod.rescan(catalog, "c", open_storage(str(root)))
    rows = _rows(catalog, "c")
    catalog.dispose()
    return rows


class Rescans:
    """Rescans of cache "c", counting those that read every catalog row of it instead of comparing with the previous
    rescan's listing (RescanResult.read_catalog)."""

    def __init__(self) -> None:
        self.catalog_reads = 0

    def __call__(self, catalog: Catalog, storage, **options) -> rescan_mod.RescanResult:
        result = rescan_mod.rescan(catalog, "c", storage, **options)
        self.catalog_reads += result.read_catalog
        return result


def test_periodic_rescans_follow_every_change(catalog_url, cache_copy, tmp_path):
    storage = open_storage(str(cache_copy))
    catalog = _catalog(catalog_url, cache_copy)
    rescans = Rescans()

    first = rescans(catalog, storage)
    assert first.added > 0 and rescans.catalog_reads == 1

    # Unchanged: the snapshot stands for the catalog, nothing is read or written.
    again = rescans(catalog, storage)
    assert (again.added, again.removed, again.updated, again.entries) == (0, 0, 0, first.entries)
    assert rescans.catalog_reads == 1

    # A job used an entry (its -atime rewritten), another wrote a new one, JAX's LRU evicted half of a third.
    atimes = sorted(cache_copy.glob("*-atime"))
    later = time.time() + 120
    os.utime(atimes[0], (later, later))
    shutil.copy(next(cache_copy.glob("*-cache")), cache_copy / f"{NEW_KEY}-cache")
    evicted = atimes[1].name[: -len("-atime")]
    (cache_copy / f"{evicted}-cache").unlink()
    (cache_copy / "notes.txt").write_text("not an entry")  # foreign files are never rows
    changed = rescans(catalog, storage)
    assert changed.updated == 1 and changed.removed == 1 and changed.added == 2  # the new entry, the orphan
    assert rescans.catalog_reads == 1
    assert _rows(catalog, "c") == _fresh_rows(tmp_path, cache_copy)
    assert rescans(catalog, storage).added == 0 and rescans.catalog_reads == 1

    # Another replica (its own Catalog on the same database) prunes an entry: the fingerprint moves, and this
    # process compares with the catalog again.
    other = Catalog(catalog_url)
    victim = sorted(cache_copy.glob("*-cache"))[0]
    victim.unlink()
    with other.session() as s:
        s.execute(delete(EntryRow).where(EntryRow.cache == "c", EntryRow.key == victim.name[: -len("-cache")],
                                         EntryRow.kind == "entry"))
    assert rescans(catalog, storage).removed == 0  # the prune dropped the row already
    assert rescans.catalog_reads == 2  # (its -atime, if any, is now an orphan row)
    assert _rows(catalog, "c") == _fresh_rows(tmp_path, cache_copy)

    # Another replica rescans after a new entry appears: this process's snapshot no longer stands.
    shutil.copy(next(cache_copy.glob("*-cache")), cache_copy / ("jit_other-" + "cd" * 32 + "-cache"))
    assert rescan_mod.rescan(other, "c", open_storage(str(cache_copy))).added == 1
    mine = rescans(catalog, storage)
    assert rescans.catalog_reads == 3 and mine.added == 0
    assert _rows(catalog, "c") == _fresh_rows(tmp_path, cache_copy)
    other.dispose()
    catalog.dispose()


def test_a_restarted_process_compares_with_the_listing_it_kept_on_disk(catalog_url, cache_copy, tmp_path, caplog):
    storage, kept = open_storage(str(cache_copy)), tmp_path / "snapshots"
    rescans = Rescans()  # these processes' (not _fresh_rows' catalogs, nor the other replica's)

    def restarted() -> Catalog:
        return _catalog(catalog_url, cache_copy, kept)

    first = restarted()
    filled = rescans(first, storage)
    assert filled.added > 0 and rescans.catalog_reads == 1
    assert rescans(first, storage).added == 0  # the sidecar follows every rescan
    first.dispose()
    assert not list(cache_copy.glob("rescan-*")), "nothing is kept in the cache root"

    # A restart, nothing changed: no catalog row read, nothing written.
    second = restarted()
    again = rescans(second, storage)
    assert (again.added, again.removed, again.updated, again.entries) == (0, 0, 0, filled.entries)
    assert rescans.catalog_reads == 1
    # Changes while it was down are found from the kept listing, as a full rescan finds them.
    shutil.copy(next(cache_copy.glob("*-cache")), cache_copy / f"{NEW_KEY}-cache")
    later = time.time() + 120
    os.utime(sorted(cache_copy.glob("*-atime"))[0], (later, later))
    second.dispose()
    third = restarted()
    changed = rescans(third, storage)
    assert (changed.added, changed.updated) == (1, 1) and rescans.catalog_reads == 1
    assert _rows(third, "c") == _fresh_rows(tmp_path, cache_copy)
    third.dispose()

    # Another replica (no kept listing of its own) prunes meanwhile: the kept listing no longer stands.
    other = Catalog(catalog_url)
    victim = sorted(cache_copy.glob("*-cache"))[0]
    victim.unlink()
    with other.session() as s:
        s.execute(delete(EntryRow).where(EntryRow.cache == "c", EntryRow.key == victim.name[: -len("-cache")],
                                         EntryRow.kind == "entry"))
    other.dispose()
    fourth = restarted()
    rescans(fourth, storage)
    assert rescans.catalog_reads == 2 and _rows(fourth, "c") == _fresh_rows(tmp_path, cache_copy)
    fourth.dispose()

    # A damaged kept listing is not evidence: the catalog is read, the rows stay right, the listing is rewritten.
    for path in kept.glob("*.listing"):
        path.write_bytes(path.read_bytes()[:100])
    fifth = restarted()
    assert rescans(fifth, storage).added == 0 and rescans.catalog_reads == 3
    assert _rows(fifth, "c") == _fresh_rows(tmp_path, cache_copy)
    fifth.dispose()
    sixth = restarted()
    rescans(sixth, storage)
    assert rescans.catalog_reads == 3
    sixth.dispose()


def test_a_large_listing_is_kept_on_disk_only_and_read_back_by_the_next_rescan(catalog_url, cache_copy, tmp_path):
    """Above ``in_memory_max`` objects the listing is not held between rescans (at a million entries it was half a
    GiB of the service's memory); the next rescan in the same process compares with the disk copy instead."""
    storage, rescans = open_storage(str(cache_copy)), Rescans()
    catalog = _catalog(catalog_url, cache_copy, tmp_path / "snapshots")
    first = rescans(catalog, storage, in_memory_max=3)
    assert first.entries > 3 and rescans.catalog_reads == 1
    assert "c" not in snapshots.kept(catalog) and list((tmp_path / "snapshots").glob("*.listing"))
    again = rescans(catalog, storage, in_memory_max=3)
    assert (again.added, again.removed, again.updated) == (0, 0, 0) and rescans.catalog_reads == 1
    shutil.copy(next(cache_copy.glob("*-cache")), cache_copy / f"{NEW_KEY}-cache")
    later = time.time() + 120
    os.utime(sorted(cache_copy.glob("*-atime"))[0], (later, later))
    changed = rescans(catalog, storage, in_memory_max=3)
    assert (changed.added, changed.updated) == (1, 1) and rescans.catalog_reads == 1
    assert "c" not in snapshots.kept(catalog)
    assert _rows(catalog, "c") == _fresh_rows(tmp_path, cache_copy)
    # A small listing is still held in memory.
    rescans(catalog, storage, in_memory_max=10_000)
    assert "c" in snapshots.kept(catalog) and rescans.catalog_reads == 1
    catalog.dispose()


def test_a_large_rescan_gives_its_memory_back(catalog_url, cache_copy, tmp_path):
    catalog = _catalog(catalog_url, cache_copy)
    storage = open_storage(str(cache_copy))
    with full_collections() as small:
        assert rescan_mod.rescan(catalog, "c", storage, release_from_entries=10_000).entries < 10_000
    assert small.full == 0  # a small cache is not worth a full collection
    with full_collections() as large:
        rescan_mod.rescan(catalog, "c", storage, release_from_entries=1)
    assert large.full == 1
    catalog.dispose()


def test_a_large_rescan_writes_in_batches_the_rows_one_write_makes(catalog_url, cache_copy, tmp_path):
    """New entries parsed and written a few at a time (a first rescan of a million entries held every row in memory
    at once): the same rows, orphans and replaced entries included, as one write makes."""
    catalog = _catalog(catalog_url, cache_copy)
    storage = open_storage(str(cache_copy))
    rescan_mod.rescan(catalog, "c", storage)
    replaced = sorted(cache_copy.glob("*-cache"))[0]
    replaced.write_bytes(replaced.read_bytes())  # another mtime: a replaced object
    (cache_copy / sorted(cache_copy.glob("*-atime"))[1].name.replace("-atime", "-cache")).unlink()  # an orphan
    shutil.copy(next(cache_copy.glob("*-cache")), cache_copy / f"{NEW_KEY}-cache")
    snapshots.kept(catalog).clear()
    result = rescan_mod.rescan(catalog, "c", storage, new_per_write=2)
    assert result.added >= 3 and result.removed >= 2
    batched = _rows(catalog, "c")
    assert batched == _fresh_rows(tmp_path, cache_copy)  # one write
    other = _catalog(f"sqlite:///{tmp_path / 'batched.sqlite'}", cache_copy)
    rescan_mod.rescan(other, "c", storage, new_per_write=3)
    assert _rows(other, "c") == batched
    other.dispose()
    catalog.dispose()


def test_a_snapshot_directory_that_cannot_be_written_costs_only_speed(catalog_url, cache_copy, tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    catalog = _catalog(catalog_url, cache_copy, blocked / "snapshots")
    storage = open_storage(str(cache_copy))
    assert rescan_mod.rescan(catalog, "c", storage).added > 0
    assert rescan_mod.rescan(catalog, "c", storage).added == 0
    warned = [r for r in caplog.records if "cannot keep rescan snapshots" in r.getMessage()]
    assert len(warned) <= 1 and (warned or "snapshots" in str(rescan_mod.snapshots._warned))
    catalog.dispose()


SORTS = ["size", "compile", "last_used", "created", "name", "hits"]


@pytest.mark.parametrize("sort", SORTS)
@pytest.mark.parametrize("desc", [False, True])
@pytest.mark.parametrize("has_cursor", [False, True])
def test_listing_pages_are_index_ranges(tmp_path, sort, desc, has_cursor):
    """Every sort, either order, first or later page: SQLite walks an index (no sort of the whole cache, which
    made a page by compile time cost 200 ms at 100k entries)."""
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.sqlite'}")
    statement = listing._page_statement("sqlite", sort, desc, has_cursor, ())
    compiled = statement.compile(dialect=sqlite_dialect.dialect())
    params = {**compiled.params, "cache": "c", "page_limit": 101, "after_key": "k", "after_value": 1}
    db = sqlite3.connect(tmp_path / "c.sqlite")
    plan = db.execute("EXPLAIN QUERY PLAN " + compiled.string, [params[n] for n in compiled.positiontup]).fetchall()
    text = " ".join(str(row[-1]) for row in plan)
    assert "TEMP B-TREE" not in text and "INDEX" in text, text
    db.close()
    catalog.dispose()


def test_a_function_filter_listed_by_name_walks_the_key(tmp_path):
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.sqlite'}")
    statement = listing._page_statement("sqlite", "name", False, False, ("function", "prefix"))
    compiled = statement.compile(dialect=sqlite_dialect.dialect())
    params = {**compiled.params, "cache": "c", "page_limit": 101, "fn_pattern": "jit_train*", "fn_lo": "jit_train",
              "fn_hi": "jit_trainz"}
    db = sqlite3.connect(tmp_path / "c.sqlite")
    plan = db.execute("EXPLAIN QUERY PLAN " + compiled.string, [params[n] for n in compiled.positiontup]).fetchall()
    assert "TEMP B-TREE" not in " ".join(str(row[-1]) for row in plan)
    db.close()
    catalog.dispose()


def test_rescans_of_an_unchanged_bucket_read_no_object(store_root, cache_copy, tmp_path):
    """Objects are read once per version, in every store: a periodic rescan of a bucket nothing changed in only
    lists, and so does a restarted process's first one (the listing it kept on disk); an entry replaced by one of the
    same size, within the second (the mtimes S3 and Azure list), is read again for its new version."""
    put_dir(store_root, cache_copy)
    url = store_root
    kept = tmp_path / "kept"
    catalog = _catalog(f"sqlite:///{tmp_path / 'c.sqlite'}", cache_copy, kept)
    storage = open_storage(url)
    assert rescan_mod.rescan(catalog, "c", storage).added > 0
    assert storage.reads > 0  # the first rescan parsed every head
    storage.reads = 0
    assert rescan_mod.rescan(catalog, "c", storage).added == 0
    assert storage.reads == 0
    catalog.dispose()
    restarted, fresh = _catalog(f"sqlite:///{tmp_path / 'c.sqlite'}", cache_copy, kept), open_storage(url)
    assert rescan_mod.rescan(restarted, "c", fresh).added == 0
    assert fresh.reads == 0
    victim = next(p.name for p in sorted(cache_copy.iterdir()) if p.name.endswith("-cache"))
    before = fresh.stat(victim)
    fresh.write_atomic(victim, b"\x00" * before.size_bytes)  # not a program: its head says corrupt
    after = fresh.stat(victim)
    if (after.size_bytes, after.mtime_s) == (before.size_bytes, before.mtime_s):  # the case only a version tells
        assert after.version != before.version
    rescan_mod.rescan(restarted, "c", fresh)
    with restarted.reader() as conn:
        status = conn.execute(select(EntryRow.status).where(EntryRow.key == victim[:-6])).scalar_one()
    assert status == "corrupt" and fresh.reads == 1
    restarted.dispose()


def _linked(root: Path, source: Path, n: int, *, atimes: int, lone: int) -> None:
    """``n`` entries under ``root``, hard links to the entry ``source`` under keys of their own, the first ``atimes``
    with an ``-atime`` (ages spread, each newer than the entry), and ``lone`` ``-atime`` files without an entry."""
    root.mkdir(exist_ok=True)
    now = time.time()
    os.utime(source, (now - 86400, now - 86400))
    for i in range(n + lone):
        key = f"jit_many-{hashlib.sha256(str(i).encode()).hexdigest()}"
        if i < n:
            os.link(source, root / f"{key}-cache")
        if i < atimes or i >= n:
            atime = root / f"{key}-atime"
            atime.write_bytes(fmt.encode_atime(int((now - i) * 1e9)))
            os.utime(atime, (now - i, now - i))


def _rows_of_files(root: Path) -> set[tuple]:
    """The rows a root makes by the rules, not by a rescan: an entry per -cache file JAX named, last used at the newer
    of its mtime and its -atime's; an orphan row per -atime file without its entry."""
    files = {p.name: p.stat() for p in root.iterdir() if p.is_file()}
    rows = set()
    for name, st in files.items():
        if fmt.parse_name(name) is None:
            continue
        key = name[:-6]
        if name.endswith("-cache"):
            atime = files.get(f"{key}-atime")
            seen = st.st_mtime if atime is None else max(st.st_mtime, atime.st_mtime)
            rows.add((key, "entry", st.st_size, st.st_mtime, seen, atime is not None))
        elif f"{key}-cache" not in files:
            rows.add((key, "orphan", st.st_size, st.st_mtime, st.st_mtime, False))
    return rows


def _listed_rows(catalog: Catalog, cache: str) -> set[tuple]:
    with catalog.session() as s:
        return {tuple(r) for r in s.execute(select(
            EntryRow.key, EntryRow.kind, EntryRow.size_bytes, EntryRow.created_s, EntryRow.seen_used_s,
            EntryRow.has_atime).where(EntryRow.cache == cache))}


@pytest.mark.parametrize("kept", ["memory", "disk"])
def test_first_periodic_and_cold_rescans_make_the_rows_the_files_say(catalog_url, cache_copy, tmp_path, kept):
    """Entries with and without -atime files, lone -atime files, names JAX did not write: the first rescan, one
    comparing with the kept listing (in memory or on disk) and one reading the catalog instead all leave exactly the
    rows the files make."""
    source = next(p for p in sorted(cache_copy.iterdir()) if p.name.endswith("-cache"))
    _linked(cache_copy, source, 300, atimes=200, lone=20)
    (cache_copy / "notes-cache").write_text("not JAX's name")
    (cache_copy / "notes.txt").write_text("not an entry")
    catalog = _catalog(catalog_url, cache_copy, tmp_path / "kept")
    storage, rescans = open_storage(str(cache_copy)), Rescans()
    in_memory_max = 10_000 if kept == "memory" else 3

    first = rescans(catalog, storage, in_memory_max=in_memory_max, new_per_write=64)
    assert first.added == len(_rows_of_files(cache_copy))
    assert _listed_rows(catalog, "c") == _rows_of_files(cache_copy)

    # Used, evicted, written, replaced; a foreign name changed, a lone -atime written.
    later = time.time() + 120
    caches = sorted(cache_copy.glob("jit_many-*-cache"))
    # (An orphan's row keeps the time its -atime had when first listed: lone -atime files are left as they are.)
    atimes = [p for p in sorted(cache_copy.glob("jit_many-*-atime")) if p.with_name(f"{p.name[:-6]}-cache").exists()]
    for p in atimes[:30]:
        os.utime(p, (later, later))
    for p in caches[:10] + atimes[40:45]:
        p.unlink()
    shutil.copy(source, cache_copy / f"{NEW_KEY}-cache")
    caches[50].unlink()
    shutil.copy(source, caches[50])
    os.utime(caches[50], (later, later))
    (cache_copy / "notes-cache").write_text("not JAX's name, changed")
    (cache_copy / ("jit_other-" + "cd" * 32 + "-atime")).write_bytes(fmt.encode_atime(time.time_ns()))
    changed = rescans(catalog, storage, in_memory_max=in_memory_max, new_per_write=7)
    assert rescans.catalog_reads == 1 and changed.added >= 3 and changed.updated > 0 and changed.removed > 0
    assert _listed_rows(catalog, "c") == _rows_of_files(cache_copy)
    assert rescans(catalog, storage, in_memory_max=in_memory_max).added == 0 and rescans.catalog_reads == 1

    snapshots.kept(catalog).clear()
    for path in (tmp_path / "kept").iterdir():
        path.unlink()
    cold = rescans(catalog, storage, in_memory_max=in_memory_max)
    assert (cold.added, cold.removed, cold.updated, rescans.catalog_reads) == (0, 0, 0, 2)
    assert cold.entries == changed.entries == len(_rows_of_files(cache_copy))
    catalog.dispose()


def test_a_first_rescan_holds_its_listing_once(cache_copy, tmp_path):
    """A first rescan takes the listing by key as it streams in and makes nothing else as large: at a million entries
    it held the listing by name, a copy by key, and each entry's item and last use (1.7 GB in one process; 2.8 times
    the listing by name here). Its peak (tracemalloc) stays near what the listing by name alone takes."""
    root = tmp_path / "many"
    _linked(root, next(p for p in sorted(cache_copy.iterdir()) if p.name.endswith("-cache")), 10_000,
            atimes=10_000, lone=0)
    catalog = _catalog(f"sqlite:///{tmp_path / 'c.sqlite'}", root, tmp_path / "kept")
    with catalog.session() as s:
        s.add(CacheRow(name="warm", url=str(cache_copy)))
    # Statements compiled and pools made once per process: not what this measures.
    rescan_mod.rescan(catalog, "warm", open_storage(str(cache_copy)))
    storage = open_storage(str(root))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        by_name, _ = storage.list_changes({})
        listing_bytes = tracemalloc.get_traced_memory()[0] - before
        del by_name
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = rescan_mod.rescan(catalog, "c", storage, in_memory_max=1000, new_per_write=250)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert result.added == 10_000
    assert peak < 1.25 * listing_bytes, (peak, listing_bytes)
    catalog.dispose()
