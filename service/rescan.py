"""Rescan: make the catalog match storage, parsing only objects it has not seen (JAX never rewrites a key).

One rescan of a cache at a time across every replica sharing the catalog (the ``scan:<cache>`` lock): two would
insert the same new rows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial

from jaxcache import entry as fmt
from jaxcache.entry import EntryKind
from jaxcache.parallel import bounded_map
from jaxcache.scan import read_head
from jaxcache.service import warmups
from jaxcache.service.catalog import CacheRow, Catalog, EntryRow
from jaxcache.service.locks import LockBusyError
from jaxcache.service.reports import EMPTY, key_stats, scan_records
from jaxcache.storage import ObjectInfo, Storage
from sqlalchemy import bindparam, case, delete, insert, select, update

log = logging.getLogger("jaxcache.service")

_CHUNK = 500


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


_KEY_MAX = EntryRow.__table__.c.key.type.length


def _list(storage: Storage) -> tuple[dict[str, ObjectInfo], dict[str, ObjectInfo]]:
    # One listing, paired in memory: the catalog holds an index of every entry anyway, and this avoids a
    # request per entry. An -atime's modification time is its access time (JAX rewrites it on each access).
    caches: dict[str, ObjectInfo] = {}
    atimes: dict[str, ObjectInfo] = {}
    for info in storage.iter_objects():
        parsed = fmt.parse_name(info.name)
        if parsed is None:
            continue
        if len(parsed.key) > _KEY_MAX or "\x00" in parsed.key:
            # Not a name JAX writes (its module names are short); PostgreSQL would refuse the row and the scan.
            log.warning("%s: skipping %s: keys longer than %d characters are not indexed", storage.url,
                        info.name[:200], _KEY_MAX)
            continue
        (caches if parsed.kind is EntryKind.CACHE else atimes)[parsed.key] = info
    return caches, atimes


def _new_row(storage: Storage, cache: str, now: float, item: tuple[str, ObjectInfo, ObjectInfo | None]) -> dict:
    key, info, atime = item
    header = read_head(storage, info)
    row = _base_row(cache, key, "entry", info, atime, now)
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


def rescan(catalog: Catalog, cache: str, storage: Storage, *, wait_s: float | None = None) -> RescanResult:
    """Bring ``cache``'s rows in line with ``storage``: add new entries, drop vanished ones, refresh last use.

    Waits for a rescan of ``cache`` that another replica (or thread) is running: without limit, or at most
    ``wait_s`` seconds (0: not at all) and then raises :class:`LockBusyError`.
    """
    lock = catalog.locks.get(f"scan:{cache}")
    if not lock.acquire(timeout=-1 if wait_s is None else wait_s):
        raise LockBusyError(f"a rescan of {cache!r} is already running (on this or another replica of the "
                            "service); try again when it ends")
    try:
        return _rescan(catalog, cache, storage)
    finally:
        lock.release()


def _rescan(catalog: Catalog, cache: str, storage: Storage) -> RescanResult:
    started = time.monotonic()
    now = time.time()
    caches, atimes = _list(storage)
    # Core rows, not ORM objects: this loads every row of the cache on each rescan.
    with catalog.reader() as conn:
        rows = conn.execute(
            select(EntryRow.key, EntryRow.kind, EntryRow.generation, EntryRow.size_bytes, EntryRow.created_s,
                   EntryRow.seen_used_s).where(EntryRow.cache == cache)
        ).all()
    known = {(r[0], r[1]): r for r in rows}
    del rows
    new_items = []
    updates = []
    for key, info in caches.items():
        atime = atimes.get(key)
        old = known.pop((key, "entry"), None)
        if old is None or old.generation != info.generation or old.size_bytes != info.size_bytes \
                or old.created_s != info.mtime_s:
            if old is not None:
                known[(key, "entry")] = old  # replaced object: drop the old row, parse the new one
            new_items.append((key, info, atime))
            continue
        seen_used = max(info.mtime_s, atime.mtime_s) if atime is not None else info.mtime_s
        if seen_used != old.seen_used_s:
            updates.append({"k_cache": cache, "k_key": key, "k_kind": "entry", "seen_used_s": seen_used,
                            "has_atime": atime is not None,
                            "atime_ns": int(atime.mtime_s * 1e9) if atime is not None else None})
    orphan_rows = []
    orphans = 0
    for key, info in atimes.items():
        if key in caches:
            continue
        orphans += 1
        if known.pop((key, "orphan"), None) is None:
            orphan_rows.append(_base_row(cache, key, "orphan", info, None, now))
    vanished = list(known)
    new_rows = list(bounded_map(partial(_new_row, storage, cache, now), new_items, workers=storage.io_workers))
    # Under the cache's write lock, so that a report ingested meanwhile (by any replica) cannot update rows this
    # commit then overwrites.
    with catalog.writing(cache) as s:
        reported = key_stats(s, cache, [r["key"] for r in new_rows])
        new_rows = [_with_reports(r, reported.get(r["key"])) for r in new_rows]
        for i in range(0, len(vanished), _CHUNK):
            for kind in ("entry", "orphan"):
                keys = [k for k, kd in vanished[i : i + _CHUNK] if kd == kind]
                if keys:
                    s.execute(delete(EntryRow).where(
                        EntryRow.cache == cache, EntryRow.kind == kind, EntryRow.key.in_(keys)))
        rows = new_rows + orphan_rows
        for i in range(0, len(rows), 5000):
            s.execute(insert(EntryRow), rows[i : i + 5000])
        if updates:
            s.execute(
                update(EntryRow)
                .where(EntryRow.cache == bindparam("k_cache"), EntryRow.key == bindparam("k_key"),
                       EntryRow.kind == bindparam("k_kind"))
                # The last hit as the row holds it now: a report may have moved it since the listing.
                .values(last_used_s=case((EntryRow.last_hit_s > bindparam("seen_used_s"), EntryRow.last_hit_s),
                                         else_=bindparam("seen_used_s")),
                        seen_used_s=bindparam("seen_used_s"), has_atime=bindparam("has_atime"),
                        atime_ns=bindparam("atime_ns")),
                updates,
                execution_options={"synchronize_session": False},
            )
    found = scan_records(catalog, cache, storage)
    covered = warmups.scan(catalog, cache, storage)
    seconds = time.monotonic() - started
    # One UPDATE, no read first: on SQLite a read-then-write transaction fails outright (SQLITE_BUSY_SNAPSHOT) when
    # another process (a replica on the same file) wrote in between.
    with catalog.session() as s:
        s.execute(update(CacheRow).where(CacheRow.name == cache)
                  .values(last_scan_s=now, last_scan_seconds=seconds, last_scan_error=None))
    return RescanResult(cache, len(rows), len(vanished), len(updates), len(caches) + orphans, seconds,
                        found.ingested, found.malformed, covered.ingested)
