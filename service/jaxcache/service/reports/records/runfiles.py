"""Run records on storage (``<root>/.jaxcache/runs/<day>/``): a rescan puts new or changed ones into the report
inbox and drains it, listing only unsettled days between full listings, as listing all costs as much as all kept.
What the last listings found is this module's, keyed by the Catalog object (one per app) and held weakly."""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
import weakref
from dataclasses import dataclass
from typing import cast

from sqlalchemy import select

from jaxcache import records
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import RecordFileRow, RunRow, max_length
from jaxcache.service.metrics import STORAGE
from jaxcache.service.reports.ingest import queue
from jaxcache.service.reports.records import malformed
from jaxcache.storage import ObjectInfo, Storage

log = logging.getLogger("jaxcache.service")

_NAME_MAX = max_length(RecordFileRow.__table__.c.name)  # longer: not a record jaxcache wrote
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DAY_S = 86400.0
#: A process lists every record at least this often, so a late first write into a settled day is found.
FULL_LISTING_S = _DAY_S
#: A run whose record is not final and was updated this recently is taken to be running: its day is listed.
LIVE_S = _DAY_S


@dataclass(frozen=True, slots=True)
class RecordScan:
    ingested: int
    malformed: int
    unchanged: int
    listed_days: tuple[str, ...] | None = None  # the day directories listed; None: all of runs/


@dataclass(slots=True)
class _Listings:
    """When this process last listed all a cache's records, and per day whether its last listing saw changes."""

    full_at: float
    changed: dict[str, bool]


_listings: weakref.WeakKeyDictionary[Catalog, dict[str, _Listings]] = weakref.WeakKeyDictionary()
_listings_lock = threading.Lock()


def listings(catalog: Catalog) -> dict[str, _Listings]:
    """What this process's last listings of ``catalog``'s caches found, by cache (clear it: as a first rescan)."""
    with _listings_lock:
        return _listings.setdefault(catalog, {})


def day_dir(name: str) -> str | None:
    """The day directory a record's name is in (``YYYY-MM-DD``), or None when it is not in one."""
    day, sep, _ = name[len(records.RUNS_PREFIX):].partition("/")
    return day if sep and _DAY.fullmatch(day) else None


def _shift(day: str, days: int) -> str:
    return (dt.date.fromisoformat(day) + dt.timedelta(days=days)).isoformat()


def _days_to_list(catalog: Catalog, cache: str, state: _Listings, now: float) -> list[str]:
    """Yesterday, today, tomorrow (clocks differ) and every known day not settled: settled is two days old, nothing
    changed at its last listing, and no run started that day still running (a long job rewrites its start day's)."""
    today = records.day_of(now)
    with catalog.reader() as conn:
        live = {records.day_of(started) for started in conn.scalars(
            select(RunRow.started_s).where(RunRow.cache == cache, RunRow.updated_s >= now - LIVE_S,
                                           RunRow.final.is_(False)))}
    recent = _shift(today, -1)
    days = {recent, today, _shift(today, 1)} | live
    days.update(d for d, changed in state.changed.items() if changed or d >= recent)
    return sorted(days)


def _prefixes(days: list[str] | None) -> list[str]:
    return [records.RUNS_PREFIX] if days is None else [f"{records.RUNS_PREFIX}{d}/" for d in days]


def _list(storage: Storage, days: list[str] | None) -> dict[str, ObjectInfo]:
    return {i.name: i for prefix in _prefixes(days) for i in storage.iter_objects(prefix, recursive=True)
            if records.is_record_name(i.name) and len(i.name) <= _NAME_MAX}


def scan_records(catalog: Catalog, cache: str, storage: Storage, *, now: float | None = None) -> RecordScan:
    """Put new or changed run records into the inbox (the caller drains it); malformed ones are counted."""
    now = time.time() if now is None else now
    # Popped: a failed scan leaves none, and the next one lists everything.
    state = listings(catalog).pop(cache, None)
    full = state is None or not 0 <= now - state.full_at < FULL_LISTING_S
    days = None if full or state is None else _days_to_list(catalog, cache, state, now)
    listing = _list(storage, days)
    # Of the listed days only: what "gone" is computed against.
    known = malformed.known(catalog, cache, _prefixes(days))
    vanished = [n for n in known if n not in listing]
    todo = malformed.changed(listing, known)
    ingested, bad = malformed.ingest_files(
        catalog, cache, storage, todo, what="run record", max_bytes=records.MAX_RECORD_BYTES,
        ingest=lambda info, data: queue.accept(catalog, cache, records.parse(data), data, source=STORAGE,
                                               name=info.name))
    malformed.forget(catalog, cache, vanished)
    touched = {day_dir(n) for n in vanished} | {day_dir(i.name) for i in todo}
    found = ({day_dir(n) for n in listing} | {day_dir(n) for n in vanished}) - {None}
    changed = {} if state is None or full else {d: c for d, c in state.changed.items() if d not in (days or ())}
    changed.update({cast(str, d): d in touched for d in found})
    listings(catalog)[cache] = _Listings(now if full or state is None else state.full_at, changed)
    return RecordScan(ingested, bad, len(listing) - len(todo), None if days is None else tuple(days))
