"""Rescan: make the catalog match storage, parsing only objects it has not seen (JAX never rewrites a key).

One rescan of a cache at a time across every replica sharing the catalog (the ``scan:<cache>`` lock): two would
insert the same new rows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial

from sqlalchemy import bindparam, case, delete, func, insert, select, update

from jaxcache import entry as fmt
from jaxcache.display import shown
from jaxcache.errors import NotRegularFileError
from jaxcache.parallel import bounded_map
from jaxcache.scan import read_head
from jaxcache.service import memory
from jaxcache.service.catalog.database import Catalog, analyze
from jaxcache.service.catalog.locks import LockBusyError
from jaxcache.service.catalog.models import CacheRow, EntryRow, max_length, table_of
from jaxcache.service.reports import retention
from jaxcache.service.reports.aggregates import EMPTY, stats_of
from jaxcache.service.reports.drain import drain
from jaxcache.service.reports.runfiles import scan_records
from jaxcache.service.rescan import snapshots
from jaxcache.service.warmups import ingest as warmups
from jaxcache.storage import ObjectInfo, Storage
from jaxcache.storage.base import Skipped, Stat, name_problem

log = logging.getLogger("jaxcache.service")

_CHUNK = 500
#: New entries parsed and written per transaction (see :func:`rescan`'s ``new_per_write``).
NEW_PER_WRITE = 20_000
#: How many of the names a rescan skipped the catalog keeps for its status (the count is whole): enough to tell what
#: jams a root, few enough for every listing of the caches. ``jaxcache doctor`` lists them all.
SKIPPED_SHOWN = 20
_NAME_SHOWN = 512  # characters of an escaped name kept (an escape is up to 10 per character of the name)


@dataclass(frozen=True, slots=True)
class RescanResult:
    """What one rescan changed."""

    cache: str
    added: int
    removed: int
    updated: int
    entries: int
    seconds: float
    records_ingested: int = 0  # run records under .jaxcache/runs/ read because they were new or changed
    records_malformed: int = 0
    warmups_ingested: int = 0  # warm-up coverage records under .jaxcache/warmups/ new or changed
    records_compacted: int = 0  # runs (processes) older than the retention folded into per-key history
    misses_explained: int = 0  # the ingested records' misses, explained once they were all in
    skipped: int = 0  # objects named like entries or records that were not read (see Skipped)
    #: True when the listing was compared with every catalog row of the cache; False when the previous rescan's
    #: listing (kept in memory or on disk) stood for them: the catalog's rows were not read.
    read_catalog: bool = False
    #: Records this rescan's drain folded that changed the catalog, by source (the inbox's, so POSTed ones too):
    #: a record the background drain took first is counted there, never twice.
    folded: dict[str, int] = field(default_factory=dict)
    #: Records this rescan's drain dropped (the catalog refused them, or could not read them), by source.
    dropped: dict[str, int] = field(default_factory=dict)


_KEY_MAX = max_length(EntryRow.__table__.c.key)


#: A file in a listing: (name, size_bytes, mtime_s, generation). The catalog's rows are read in the same shape
#: (name, size_bytes, created_s, generation), so that "unchanged" is a set difference of the two, computed in C
#: rather than by a loop over every entry.
Listed = tuple[str, int, float, int | None]


def _by_key(listing: dict[str, Stat], foreign: set[str]) -> tuple[dict[str, Listed], dict[str, Listed]]:
    # The listing paired in memory by key: the catalog holds an index of every entry anyway, and this avoids a
    # request per entry. An -atime's modification time is its access time (JAX rewrites it on each access).
    # Names are checked afterwards, and only those of keys the catalog does not know (see _drop_foreign).
    caches = {name[:-6]: (name, *stat) for name, stat in listing.items()
              if name.endswith("-cache") and name not in foreign}
    atimes = {name[:-6]: (name, *stat) for name, stat in listing.items()
              if name.endswith("-atime") and name not in foreign}
    return caches, atimes


def _orphans(caches: dict[str, Listed], atimes: dict[str, Listed]) -> set[str]:
    """Keys with an -atime and no entry."""
    return atimes.keys() - caches.keys()


def _last_use(caches: dict[str, Listed], atimes: dict[str, Listed]) -> dict[str, float]:
    """Each entry's last use as storage shows it: the newer of its creation and its -atime."""
    return {key: (item[2] if (a := atimes.get(key)) is None or a[2] < item[2] else a[2])
            for key, item in caches.items()}


def _skip_reason(name: str) -> str | None:
    """Why a JAX-named entry or ``-atime`` ``name`` is skipped rather than indexed, or None."""
    if (problem := name_problem(name)) is not None:
        return problem  # a backslash in it: skipped, never fatal for the rest
    if len(name) - 6 > _KEY_MAX:
        # Not a name JAX writes (its module names are short); PostgreSQL would refuse the row and the scan.
        return f"keys longer than {_KEY_MAX} characters are not indexed"
    return None


def _drop_foreign(storage: Storage, listed: dict[str, Listed], new_keys: set[str], foreign: set[str]) -> None:
    """Remove from ``listed`` the new keys that are not JAX's names (the known ones were checked when their rows
    were made), or that cannot be indexed (:func:`_skip_reason`), adding their names to ``foreign``."""
    for key in new_keys:
        name = listed[key][0]
        if fmt.parse_name(name) is not None:
            if (why := _skip_reason(name)) is None:
                continue
            log.warning("%s: skipping %s: %s", storage.url, shown(name[:200]), why)
        del listed[key]
        foreign.add(name)


def _count_foreign(skipped: Skipped, foreign: set[str]) -> None:
    """Count in ``skipped`` the names of ``foreign`` that are JAX's but cannot be indexed. From the set, not from
    :func:`_drop_foreign`: a rescan that finds the listing unchanged judges no name again, and still shows them."""
    for name in foreign:
        if fmt.parse_name(name) is not None and (why := _skip_reason(name)) is not None:
            skipped.add(name, why)


def skipped_names(skipped: Skipped) -> list[dict[str, str]]:
    """The first :data:`SKIPPED_SHOWN` names of ``skipped`` (by name) as the catalog keeps them: escaped for display
    (:func:`shown`), which also makes a local name that is not UTF-8 storable as JSON, with why each was skipped."""
    return [{"name": shown(name)[:_NAME_SHOWN], "why": why} for name, why in skipped.items()[:SKIPPED_SHOWN]]


def _info(item: Listed) -> ObjectInfo:
    return ObjectInfo(*item)


def _new_row(storage: Storage, cache: str, now: float, item: tuple[str, Listed, Listed | None]) -> dict | None:
    """The row of a new entry; None for one that is no longer a regular file (swapped after the listing): the
    next rescan judges it again."""
    key, listed, atime = item
    info = _info(listed)
    try:
        header = read_head(storage, info)
    except NotRegularFileError as exc:
        log.warning("%s: skipping %s for now: %s", storage.url, shown(info.name[:200]), exc)
        return None
    row = _base_row(cache, key, "entry", info, None if atime is None else _info(atime), now)
    row.update(
        compression=header.compression.value, compile_seconds=header.compile_seconds,
        status=header.status.value, reason=header.reason,
    )
    return row


def _base_row(cache: str, key: str, kind: str, info: ObjectInfo, atime: ObjectInfo | None, now: float) -> dict:
    atime_ns = int(atime.mtime_s * 1e9) if atime is not None else None
    seen_used = max(info.mtime_s, atime.mtime_s) if atime is not None else info.mtime_s
    return {
        "cache": cache, "key": key, "kind": kind, "module": key[: -fmt.HASH_HEX_LEN - 1], "name": info.name,
        "size_bytes": info.size_bytes, "created_s": info.mtime_s, "last_used_s": seen_used,
        "seen_used_s": seen_used, "generation": info.generation, "has_atime": atime is not None,
        "atime_ns": atime_ns, "compression": None, "compile_seconds": None, "status": None, "reason": None,
        "first_seen_s": now, **EMPTY,
    }


def _with_reports(row: dict, stats: dict | None) -> dict:
    # Reports may name a key before a rescan finds its entry: the new row starts with their aggregates.
    if stats is not None:
        row.update(stats)
        hit = stats["last_hit_s"]
        if hit is not None and hit > row["seen_used_s"]:
            row["last_used_s"] = hit
    return row


def rescan(catalog: Catalog, cache: str, storage: Storage, *, wait_s: float | None = None,
           retain_s: float | None = None, new_per_write: int = NEW_PER_WRITE,
           in_memory_max: int = snapshots.IN_MEMORY_MAX,
           release_from_entries: int = memory.RELEASE_FROM_ENTRIES) -> RescanResult:
    """Bring ``cache``'s rows in line with ``storage``: add new entries, drop vanished ones, refresh last use;
    then, with ``retain_s``, compact the runs older than that (:mod:`.retention`).

    Waits for a rescan of ``cache`` that another replica (or thread) is running: without limit, or at most
    ``wait_s`` seconds (0: not at all) and then raises :class:`LockBusyError`. New entries are parsed and written
    ``new_per_write`` at a time; a listing of more than ``in_memory_max`` objects is kept for the next rescan on
    disk only (:mod:`.snapshots`); a rescan of at least ``release_from_entries`` entries ends by handing its memory
    back (:func:`.memory.release`).
    """
    lock = catalog.locks.get(f"scan:{cache}")
    if not lock.acquire(timeout=-1 if wait_s is None else wait_s):
        raise LockBusyError(f"a rescan of {cache!r} is already running (on this or another replica of the "
                            "service); try again when it ends")
    try:
        # What this rescan skips, apart from what the storage (shared with prunes and requests) skipped before.
        with storage.skipped.collecting() as skipped:
            result = _rescan(catalog, cache, storage, retain_s, skipped, new_per_write, in_memory_max)
    finally:
        lock.release()
    if result.entries >= release_from_entries:
        memory.release()
    return result


def _delete(s, cache: str, vanished: list[tuple[str, str]]) -> None:
    for i in range(0, len(vanished), _CHUNK):
        for kind in ("entry", "orphan"):
            keys = [k for k, kd in vanished[i : i + _CHUNK] if kd == kind]
            if keys:
                s.execute(delete(EntryRow).where(EntryRow.cache == cache, EntryRow.kind == kind,
                                                 EntryRow.key.in_(keys)))


def _known_statement():
    return (select(EntryRow.key, EntryRow.kind, EntryRow.name, EntryRow.size_bytes, EntryRow.created_s,
                   EntryRow.generation, EntryRow.seen_used_s).where(EntryRow.cache == bindparam("cache")))


def _known(catalog: Catalog, cache: str) -> tuple[dict[str, Listed], dict[str, float], set[str]]:
    """The catalog's rows of ``cache``: entries as Listed tuples, their last use as storage showed it, and the keys
    of orphan rows."""
    with catalog.reader() as conn:
        rows = list(conn.execute(_known_statement(), {"cache": cache}))
    entries = {r[0]: r[2:6] for r in rows if r[1] == "entry"}
    seen = {r[0]: r[6] for r in rows if r[1] == "entry"}
    orphans = {r[0] for r in rows if r[1] != "entry"}
    return entries, seen, orphans


def _fingerprint_statement():
    return select(
        select(func.count()).select_from(EntryRow).where(EntryRow.cache == bindparam("cache")).scalar_subquery(),
        select(CacheRow.last_scan_s).where(CacheRow.name == bindparam("cache")).scalar_subquery(),
        select(CacheRow.last_scan_error).where(CacheRow.name == bindparam("cache")).scalar_subquery(),
    )


def _fingerprint(conn, cache: str) -> tuple:
    """(rows, last scan, last scan error) of a cache. Entry rows change in three ways: rescans add and drop them
    and refresh their last use, prunes and DELETE drop them. Every rescan, here or in another replica, ends by
    noting its time (or its error), and a drop changes the count: so an equal fingerprint means the rows are the
    ones the last rescan of this process left. Read from an index, not the rows: it costs milliseconds."""
    return tuple(conn.execute(_fingerprint_statement(), {"cache": cache}).one())


def _rescan(catalog: Catalog, cache: str, storage: Storage, retain_s: float | None,
            skipped: Skipped, new_per_write: int, in_memory_max: int) -> RescanResult:
    started = time.monotonic()
    now = time.time()
    # The service rescans each cache every few minutes, mostly finding nothing new: the previous rescan's snapshot
    # stands for the catalog's rows unless something else changed them, and then a listing equal to the previous
    # one means nothing to write. Popped: a rescan that fails leaves none behind.
    with catalog.reader() as conn:
        fingerprint = _fingerprint(conn, cache)
    snap = snapshots.take(catalog, cache, storage, fingerprint)
    if snap is not None:
        changes, gone = storage.list_changes(snap.listing)
        if not changes and not gone:
            _count_foreign(skipped, snap.foreign)
            result = _finish(catalog, cache, storage, retain_s, started, now, skipped, added=0, removed=0,
                             updated=0, entries=snap.entries)
            snap.fingerprint = (fingerprint[0], now, None)
            snapshots.keep(catalog, cache, storage, snap, listing_changed=False, in_memory_max=in_memory_max)
            return result
        foreign = snap.foreign
        known, atimes_before = _by_key(snap.listing, foreign)
        known_seen, known_orphans = _last_use(known, atimes_before), _orphans(known, atimes_before)
        listing = snap.listing
        for name in gone:
            del listing[name]
            foreign.discard(name)
        foreign.difference_update(changes)  # judged again below
        listing.update(changes)
    else:
        # From the catalog, before the listing: a row deleted after this (a prune, a DELETE) is gone from storage
        # too, so both agree.
        known, known_seen, known_orphans = _known(catalog, cache)
        listing, _ = storage.list_changes({})
        foreign = set()
    caches, atimes = _by_key(listing, foreign)
    known_keys = known.keys() | known_orphans if known_orphans else known.keys()
    _drop_foreign(storage, caches, caches.keys() - known_keys, foreign)
    _drop_foreign(storage, atimes, atimes.keys() - known_keys, foreign)
    # New keys and replaced objects (another size, creation time or generation): parsed and (re)inserted.
    # (Dict equality first: C-fast, and the answer on an unchanged root, where the set difference hashes 100k
    # tuples for nothing.)
    changed = set() if caches == known else {key for key, _ in caches.items() - known.items()}
    vanished = [(k, "entry") for k in known.keys() - caches.keys()]
    vanished += [(k, "entry") for k in changed if k in known]  # replaced: the old row goes, the new one comes
    new_items = [(key, caches[key], atimes.get(key)) for key in changed]
    seen = _last_use(caches, atimes)
    updates = []
    for key, seen_used in ({}.items() if seen == known_seen else seen.items() - known_seen.items()):
        if key in changed:
            continue
        atime = atimes.get(key)
        updates.append({"k_cache": cache, "k_key": key, "k_kind": "entry", "seen_used_s": seen_used,
                        "has_atime": atime is not None, "atime_ns": int(atime[2] * 1e9) if atime is not None else None})
    lone = _orphans(caches, atimes)
    orphan_rows = [_base_row(cache, key, "orphan", _info(atimes[key]), None, now) for key in lone - known_orphans]
    vanished += [(k, "orphan") for k in known_orphans - lone]
    orphans = len(lone)
    # New entries are parsed and written new_per_write at a time: a first rescan of a million-entry root held every
    # row in memory at once (gigabytes) and the write lock for minutes. One batch (the usual rescan) is one
    # transaction as before; the deletes go with the first, the rest with the last.
    batches = [new_items[i : i + new_per_write] for i in range(0, len(new_items), new_per_write)] or [[]]
    added = len(orphan_rows)
    for number, batch in enumerate(batches):
        new_rows = [r for r in bounded_map(partial(_new_row, storage, cache, now), batch, workers=storage.io_workers)
                    if r is not None]
        # Under the cache's write lock, so that a report ingested meanwhile (by any replica) cannot update rows
        # this commit then overwrites.
        with catalog.writing(cache) as s:
            if number == 0:
                _delete(s, cache, vanished)
            reported = stats_of(s.connection(), cache, [r["key"] for r in new_rows])
            rows = [_with_reports(r, reported.get(r["key"])) for r in new_rows]
            if number == len(batches) - 1:
                rows += orphan_rows
            for i in range(0, len(rows), 5000):
                s.execute(insert(EntryRow), rows[i : i + 5000])
            added += len(new_rows)
            if number < len(batches) - 1:
                continue
            if updates:
                # Core, on the session's connection: an ORM UPDATE given many parameter sets is SQLAlchemy's
                # "bulk update by primary key", which refuses a WHERE clause of bound parameters.
                s.connection().execute(
                    update(table_of(EntryRow))
                    .where(EntryRow.cache == bindparam("k_cache"), EntryRow.key == bindparam("k_key"),
                           EntryRow.kind == bindparam("k_kind"))
                    # The last hit as the row holds it now: a report may have moved it since the listing.
                    .values(last_used_s=case((EntryRow.last_hit_s > bindparam("seen_used_s"), EntryRow.last_hit_s),
                                             else_=bindparam("seen_used_s")),
                            seen_used_s=bindparam("seen_used_s"), has_atime=bindparam("has_atime"),
                            atime_ns=bindparam("atime_ns")),
                    updates,
                )
            if catalog.dialect == "postgresql" and _bulk(added + len(vanished), len(known) + len(known_orphans)):
                # The planner learns the new rows now, not at autovacuum's next round (up to a minute on): with the
                # statistics of an empty table, every listing page sorted all of the cache's rows.
                analyze(s.connection(), ["entries"])
            # Inside the write lock: nobody else's change can fall between the writes and this count.
            count = _fingerprint(s.connection(), cache)[0]
    _count_foreign(skipped, foreign)
    result = _finish(catalog, cache, storage, retain_s, started, now, skipped, added=added,
                     removed=len(vanished), updated=len(updates), entries=len(caches) + orphans,
                     read_catalog=snap is None)
    # What _finish noted (this scan's time, no error) is part of the fingerprint.
    snapshots.keep(catalog, cache, storage, snapshots.Snapshot((count, now, None), listing, foreign,
                                                            len(caches) + orphans), listing_changed=True,
                   in_memory_max=in_memory_max)
    return result


def _bulk(changed: int, rows: int) -> bool:
    """Whether changing ``changed`` of a cache's ``rows`` is a bulk load: a tenth of them, what makes autovacuum
    analyze a table (its default ``autovacuum_analyze_scale_factor``)."""
    return changed > 0 and changed >= rows / 10


def _finish(catalog: Catalog, cache: str, storage: Storage, retain_s: float | None,
            started: float, now: float, skipped: Skipped, *, added: int, removed: int, updated: int,
            entries: int, read_catalog: bool = False) -> RescanResult:
    """Ingest run and warm-up records, compact the old runs, and note the scan's end and what it skipped."""
    found = scan_records(catalog, cache, storage)
    covered = warmups.scan(catalog, cache, storage)
    # Once every record and warm-up this rescan read is in, whatever order they were listed in: their misses are
    # explained against all of them.
    drained = drain(catalog, cache, root=storage.url)
    compacted = retention.compact(catalog, cache, storage, retain_s=retain_s).runs if retain_s is not None else 0
    seconds = time.monotonic() - started
    # One UPDATE, no read first: on SQLite a read-then-write transaction fails outright (SQLITE_BUSY_SNAPSHOT) when
    # another process (a replica on the same file) wrote in between.
    with catalog.session() as s:
        s.execute(update(CacheRow).where(CacheRow.name == cache)
                  .values(last_scan_s=now, last_scan_seconds=seconds, last_scan_error=None,
                          last_scan_skipped=skipped.count, last_scan_skipped_names=skipped_names(skipped)))
    return RescanResult(cache, added, removed, updated, entries, seconds, found.ingested, found.malformed,
                        covered.ingested, compacted, sum(drained.misses.values()), skipped.count, read_catalog,
                        dict(drained.fresh), dict(drained.malformed))
