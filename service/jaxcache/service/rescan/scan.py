"""Rescans: make the catalog match storage, parsing only unseen objects (JAX never rewrites a key); one per cache
across replicas (the ``scan:<cache>`` lock), as two would insert the same rows. What a round does after the listing
is handed in (``after``: rounds.py), as are the rescans handed to the features that need one."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from typing import Any, Protocol

from pydantic import Field
from sqlalchemy import Select, bindparam, case, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from jaxcache import entry as fmt
from jaxcache.display import shown
from jaxcache.errors import NotRegularFileError
from jaxcache.parallel import bounded_map
from jaxcache.scan import read_head
from jaxcache.service import memory
from jaxcache.service.catalog import models
from jaxcache.service.catalog.coordination import LockBusyError
from jaxcache.service.catalog.database import Catalog, analyze
from jaxcache.service.catalog.models import CacheRow, EntryRow, max_length, table_of
from jaxcache.service.rescan import snapshots
from jaxcache.service.rescan.schemas import RescanModel
from jaxcache.storage import ObjectInfo, Storage
from jaxcache.storage.base import Listed, Skipped, Stat, name_problem, same_stat

log = logging.getLogger("jaxcache.service")

_CHUNK = 500
#: New entries parsed and written per transaction (see :func:`rescan`'s ``new_per_write``).
NEW_PER_WRITE = 20_000
_NAME_SHOWN = 512  # characters of an escaped name kept (an escape is up to 10 per character of the name)


@dataclass(frozen=True, slots=True)
class Followed:
    """What the steps after a rescan's listing did (rounds.py runs them in the scan lock), for the rescan's answer."""

    records_ingested: int = 0
    records_malformed: int = 0
    warmups_ingested: int = 0
    records_compacted: int = 0
    misses_explained: int = 0
    folded: dict[str, int] = field(default_factory=dict)  # records the drain folded, by source
    dropped: dict[str, int] = field(default_factory=dict)  # records the drain dropped, by source


#: The steps after the listing, run in the scan lock before the scan's end is noted (rounds.after_rescan).
After = Callable[[Catalog, str, Storage], Followed]


class RescanResult(RescanModel):
    """What the API answers of a rescan, and what the service notes of it besides."""

    misses_explained: int = 0
    read_catalog: bool = False  # False when the previous rescan's listing stood for the catalog's rows
    folded: dict[str, int] = Field(default_factory=dict)  # records the drain folded, by source
    dropped: dict[str, int] = Field(default_factory=dict)  # records the drain dropped, by source


_KEY_MAX = max_length(EntryRow.__table__.c.key)


def _to_parse(caches: dict[str, Stat], known: dict[str, Stat], keys: Iterable[str] | None) -> set[str]:
    """The entries to (re)parse: new keys and replaced objects, of ``keys`` (None: all). Equality first, as it is
    C-fast on an unchanged root, then storage's one rule (a version that stayed the same is the same object)."""
    if keys is None:
        if caches == known:
            return set()
        if not known:
            return set(caches)
        keys = caches.keys()
    return {key for key in keys if (stat := caches.get(key)) is not None
            and ((was := known.get(key)) is None or (stat != was and not same_stat(stat, was)))}


def _last_use(caches: dict[str, Stat], atimes: dict[str, Stat], keys: Iterable[str]) -> dict[str, float]:
    """The last use of the entries ``keys`` as storage shows it: the newer of its creation and its -atime."""
    used = {}
    for key in keys:
        created, atime = caches[key][1], atimes.get(key)
        used[key] = created if atime is None or atime[1] < created else atime[1]
    return used


def _skip_reason(name: str) -> str | None:
    """Why a JAX-named entry or ``-atime`` ``name`` is skipped rather than indexed, or None."""
    if (problem := name_problem(name)) is not None:
        return problem  # a backslash in it: skipped, never fatal for the rest
    if len(name) - 6 > _KEY_MAX:
        # Not a name JAX writes (its module names are short); PostgreSQL would refuse the row and the scan.
        return f"keys longer than {_KEY_MAX} characters are not indexed"
    return None


def _drop_foreign(storage: Storage, listing: snapshots.Listing, side: dict[str, Stat], suffix: str,
                  new_keys: set[str]) -> None:
    """Set aside the new keys of ``side`` (names ending in ``suffix``) that are not JAX's names or cannot be
    indexed."""
    for key in new_keys:
        name = key + suffix
        if fmt.parse_name(name) is not None:
            if (why := _skip_reason(name)) is None:
                continue
            log.warning("%s: skipping %s: %s", storage.url, shown(name[:200]), why)
        listing.set_aside(side, suffix, key)


def _count_foreign(skipped: Skipped, foreign: set[str]) -> None:
    """Count in ``skipped`` the JAX names of ``foreign`` that cannot be indexed (also when the listing is unchanged)."""
    for name in foreign:
        if fmt.parse_name(name) is not None and (why := _skip_reason(name)) is not None:
            skipped.add(name, why)


def skipped_names(skipped: Skipped) -> list[dict[str, str]]:
    """The first :data:`SKIPPED_SHOWN` skipped names, escaped for display (and JSON), each with why."""
    return [{"name": shown(name)[:_NAME_SHOWN], "why": why} for name, why in skipped.items()[:models.SKIPPED_SHOWN]]


def _new_row(storage: Storage, cache: str, now: float, item: tuple[str, Listed, Listed | None]) -> dict | None:
    """The row of a new entry; None when it is no longer a regular file (the next rescan judges it again)."""
    key, listed, atime = item
    info = ObjectInfo(*listed)
    try:
        header = read_head(storage, info)
    except NotRegularFileError as exc:
        log.warning("%s: skipping %s for now: %s", storage.url, shown(info.name[:200]), exc)
        return None
    row = _base_row(cache, key, "entry", info, None if atime is None else ObjectInfo(*atime), now)
    row.update(compression=header.compression.value, compile_seconds=header.compile_seconds,
               status=header.status.value, reason=header.reason)
    return row


def _base_row(cache: str, key: str, kind: str, info: ObjectInfo, atime: ObjectInfo | None, now: float) -> dict:
    atime_ns = int(atime.mtime_s * 1e9) if atime is not None else None
    seen_used = max(info.mtime_s, atime.mtime_s) if atime is not None else info.mtime_s
    return {
        "cache": cache, "key": key, "kind": kind, "module": key[: -fmt.HASH_HEX_LEN - 1], "name": info.name,
        "size_bytes": info.size_bytes, "created_s": info.mtime_s, "last_used_s": seen_used,
        "seen_used_s": seen_used, "version": info.version, "has_atime": atime is not None,
        "atime_ns": atime_ns, "compression": None, "compile_seconds": None, "status": None, "reason": None,
        "first_seen_s": now, **models.EMPTY}


def _with_reports(row: dict, stats: dict | None) -> dict:
    """A new row with the aggregates of reports that named its key before the rescan found it."""
    if stats is not None:
        row.update(stats)
        hit = stats["last_hit_s"]
        if hit is not None and hit > row["seen_used_s"]:
            row["last_used_s"] = hit
    return row


class Rescan(Protocol):
    """A cache's rescan and the steps after it, as app.py hands it to the rescan route (rounds.rescan_cache)."""

    def __call__(self, name: str, *, wait_s: float | None = None) -> RescanResult: ...


def rescan(catalog: Catalog, cache: str, storage: Storage, *, wait_s: float | None = None,
           after: After | None = None, new_per_write: int = NEW_PER_WRITE,
           in_memory_max: int = snapshots.IN_MEMORY_MAX,
           release_from_entries: int = memory.RELEASE_FROM_ENTRIES) -> RescanResult:
    """Bring ``cache``'s rows in line with ``storage``, then run ``after`` in the same lock. Waits at most ``wait_s``
    for another rescan (then LockBusyError); writes ``new_per_write`` entries a transaction; keeps listings over
    ``in_memory_max`` on disk only; releases memory from ``release_from_entries`` entries."""
    lock = catalog.locks.get(f"scan:{cache}")
    if not lock.acquire(timeout=-1 if wait_s is None else wait_s):
        raise LockBusyError(f"a rescan of {cache!r} is already running (on this or another replica of the "
                            "service); try again when it ends")
    try:
        # What this rescan skips, apart from what the storage (shared with prunes and requests) skipped before.
        with storage.skipped.collecting() as skipped:
            result = _rescan(catalog, cache, storage, after, skipped, new_per_write, in_memory_max)
    finally:
        lock.release()
    if result.entries >= release_from_entries:
        memory.release()
    return result


def wait_for_rescans(catalog: Catalog, cache: str) -> None:
    """Return once no rescan of ``cache`` runs, on this replica or another: waits for the one that does."""
    lock = catalog.locks.get(f"scan:{cache}")
    lock.acquire()
    lock.release()


def _delete(s, cache: str, vanished: list[tuple[str, str]]) -> None:
    for kind in ("entry", "orphan"):
        keys = [k for k, kd in vanished if kd == kind]
        for i in range(0, len(keys), _CHUNK):
            s.execute(delete(EntryRow).where(EntryRow.cache == cache, EntryRow.kind == kind,
                                             EntryRow.key.in_(keys[i : i + _CHUNK])))


_KNOWN = select(EntryRow.key, EntryRow.kind, EntryRow.size_bytes, EntryRow.created_s, EntryRow.version,
                EntryRow.seen_used_s).where(EntryRow.cache == bindparam("cache"))


def _known(catalog: Catalog, cache: str) -> tuple[dict[str, Stat], dict[str, float], set[str]]:
    """``cache``'s entry rows as their objects' stats by key, their last use as storage showed it, and its orphan
    keys; read row by row, not as a list of every row first."""
    entries: dict[str, Stat] = {}
    seen: dict[str, float] = {}
    orphans: set[str] = set()
    with catalog.reader() as conn:
        for key, kind, size, created, version, seen_used in conn.execute(_KNOWN, {"cache": cache}):
            if kind == "entry":
                entries[key] = (size, created, version)
                seen[key] = seen_used
            else:
                orphans.add(key)
    return entries, seen, orphans


_FINGERPRINT = select(
    select(func.count()).select_from(EntryRow).where(EntryRow.cache == bindparam("cache")).scalar_subquery(),
    select(CacheRow.last_scan_s).where(CacheRow.name == bindparam("cache")).scalar_subquery(),
    select(CacheRow.last_scan_error).where(CacheRow.name == bindparam("cache")).scalar_subquery(),
)


# Core, not ORM: ORM bulk update by primary key refuses a WHERE clause of bound parameters. The last hit is the row's
# own: a report may have moved it since the listing.
_UPDATE_SEEN = (
    update(table_of(EntryRow)).where(EntryRow.cache == bindparam("k_cache"), EntryRow.key == bindparam("k_key"),
                                     EntryRow.kind == bindparam("k_kind"))
    .values(last_used_s=case((EntryRow.last_hit_s > bindparam("seen_used_s"), EntryRow.last_hit_s),
                             else_=bindparam("seen_used_s")),
            seen_used_s=bindparam("seen_used_s"), has_atime=bindparam("has_atime"), atime_ns=bindparam("atime_ns")))


def _fingerprint(conn, cache: str) -> tuple:
    """(rows, last scan, last scan error) of a cache, from an index: equal means the rows are as the last rescan of
    this process left them, since every rescan notes its time and every drop changes the count."""
    return tuple(conn.execute(_FINGERPRINT, {"cache": cache}).one())


def _rescan(catalog: Catalog, cache: str, storage: Storage, after: After | None,
            skipped: Skipped, new_per_write: int, in_memory_max: int) -> RescanResult:
    started, now = time.monotonic(), time.time()
    # The last snapshot stands for the catalog's rows unless they changed; popped, so a failed rescan leaves none.
    with catalog.reader() as conn:
        fingerprint = _fingerprint(conn, cache)
    snap = snapshots.take(catalog, cache, storage, fingerprint)
    touched: set[str] | None = None  # the keys whose objects changed since the kept listing; None: every key
    known_seen: dict[str, float] | None = None  # read from the catalog; else taken from the kept listing
    atimes_before: dict[str, Stat] = {}
    if snap is not None:
        changes, gone = storage.list_changes(snap.listing)
        if not changes and not gone:
            _count_foreign(skipped, snap.foreign)
            result = _finish(catalog, cache, storage, after, started, now, skipped, added=0, removed=0,
                             updated=0, entries=snap.entries)
            snap.fingerprint = (fingerprint[0], now, None)
            snapshots.keep(catalog, cache, storage, snap, in_memory_max=in_memory_max)
            return result
        # The kept listing stands for the catalog's rows: only the keys of what changed are compared.
        listing = snapshots.Listing.of(snapshots.popped(snap.listing), aside=snap.foreign)
        known, atimes_before = dict(listing.caches), dict(listing.atimes)
        known_orphans = atimes_before.keys() - known.keys()
        for name in gone:
            listing.discard(name)
        for name, stat in changes.items():
            listing.add(name, stat)  # judged again below, also where it was set aside
        touched = {name[:-6] for names in (changes, gone) for name in names}
    else:
        # From the catalog before the listing: a row deleted after this is gone from storage too. The listing is
        # taken by key as storage streams it, each key one string with the catalog's.
        known, known_seen, known_orphans = _known(catalog, cache)
        listing = snapshots.Listing.of(storage.iter_listing(), keys={key: key for key in known})
    caches, atimes = listing.caches, listing.atimes
    known_keys = known.keys() | known_orphans if known_orphans else known.keys()
    _drop_foreign(storage, listing, caches, "-cache", caches.keys() - known_keys)
    _drop_foreign(storage, listing, atimes, "-atime", atimes.keys() - known_keys)
    changed = _to_parse(caches, known, touched)  # new keys and replaced objects are (re)parsed
    vanished = [(k, "entry") for k in known.keys() - caches.keys()]
    vanished += [(k, "entry") for k in changed & known.keys()]  # replaced: the old row goes, the new one comes
    # Entries kept whose last use storage shows may have moved: every one after a catalog read, else the touched.
    maybe = (known.keys() if touched is None else touched) & caches.keys()
    maybe.difference_update(changed)
    seen = _last_use(caches, atimes, maybe)
    seen_before = _last_use(known, atimes_before, maybe) if known_seen is None else known_seen
    updates = []
    for key, seen_used in seen.items():
        if seen_used != seen_before[key]:
            atime = atimes.get(key)
            updates.append({"k_cache": cache, "k_key": key, "k_kind": "entry", "seen_used_s": seen_used,
                            "has_atime": atime is not None,
                            "atime_ns": int(atime[1] * 1e9) if atime is not None else None})
    del maybe, seen, seen_before, known_seen
    lone = atimes.keys() - caches.keys()  # an -atime and no entry
    orphan_rows = [_base_row(cache, key, "orphan", ObjectInfo(key + "-atime", *atimes[key]), None, now)
                   for key in lone - known_orphans]
    vanished += [(k, "orphan") for k in known_orphans - lone]
    entries = len(caches) + len(lone)
    # new_per_write at a time, so a huge first rescan never holds all rows or the lock at once; deletes go first.
    # The new entries' names are made a batch at a time too.
    todo = iter(changed)
    batches = -(-len(changed) // new_per_write) or 1
    added = len(orphan_rows)
    for number in range(batches):
        batch = [(key, (key + "-cache", *caches[key]), None if (a := atimes.get(key)) is None else (key + "-atime", *a))
                 for key in islice(todo, new_per_write)]
        new_rows = [r for r in bounded_map(partial(_new_row, storage, cache, now), batch, workers=storage.io_workers)
                    if r is not None]
        # Under the cache's write lock, so a report ingested meanwhile cannot be overwritten by this commit.
        with catalog.writing(cache) as s:
            if number == 0:
                _delete(s, cache, vanished)
            reported = stats_of(s.connection(), cache, [r["key"] for r in new_rows])
            rows = [_with_reports(r, reported.get(r["key"])) for r in new_rows]
            if number == batches - 1:
                rows += orphan_rows
            for i in range(0, len(rows), 5000):
                s.execute(insert(EntryRow), rows[i : i + 5000])
            added += len(new_rows)
            if number < batches - 1:
                continue
            if updates:
                s.connection().execute(_UPDATE_SEEN, updates)
            # A bulk load (a tenth, autovacuum's analyze scale factor) is analyzed now: empty-table statistics made
            # every listing sort all rows until autovacuum's next round.
            written = added + len(vanished)
            if catalog.dialect == "postgresql" and written and written >= (len(known) + len(known_orphans)) / 10:
                analyze(s.connection(), ["entries"])
            # Inside the write lock: nobody else's change can fall between the writes and this count.
            count = _fingerprint(s.connection(), cache)[0]
    del changed, batch, new_rows, rows  # not held while the listing is kept
    _count_foreign(skipped, listing.aside())
    result = _finish(catalog, cache, storage, after, started, now, skipped, added=added,
                     removed=len(vanished), updated=len(updates), entries=entries, read_catalog=snap is None)
    # What _finish noted (this scan's time, no error) is part of the fingerprint.
    snapshots.keep_new(catalog, cache, storage, (count, now, None), listing, entries, in_memory_max=in_memory_max)
    return result


def _finish(catalog: Catalog, cache: str, storage: Storage, after: After | None,
            started: float, now: float, skipped: Skipped, *, added: int, removed: int, updated: int,
            entries: int, read_catalog: bool = False) -> RescanResult:
    """Run the steps after the listing (``after``), and note the scan's end and what it skipped."""
    followed = Followed() if after is None else after(catalog, cache, storage)
    seconds = time.monotonic() - started
    # One UPDATE, no read first: SQLite fails a read-then-write transaction (SQLITE_BUSY_SNAPSHOT) after another write.
    with catalog.session() as s:
        s.execute(update(CacheRow).where(CacheRow.name == cache)
                  .values(last_scan_s=now, last_scan_seconds=seconds, last_scan_error=None,
                          last_scan_skipped=skipped.count, last_scan_skipped_names=skipped_names(skipped)))
    return RescanResult(cache=cache, added=added, removed=removed, updated=updated, entries=entries, seconds=seconds,
                        skipped=skipped.count, read_catalog=read_catalog, **dataclasses.asdict(followed))


def stats_of(conn: Connection, cache: str, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{key: aggregates}`` for those of ``keys`` that run records mention (for entry rows a rescan adds)."""
    ordered = sorted(keys)
    return {row[0]: dict(zip(models.AGGREGATES, row[1:], strict=True)) for i in range(0, len(ordered), _CHUNK)
            for row in conn.execute(_stats_of(), {"cache": cache, "keys": ordered[i : i + _CHUNK]})}


@functools.cache  # built once: building a statement cost more than running it
def _stats_of() -> Select:
    k = models.KeyStatsRow
    return select(k.key, *(getattr(k, n) for n in models.AGGREGATES)).where(
        k.cache == bindparam("cache"), k.key.in_(bindparam("keys", expanding=True)))
