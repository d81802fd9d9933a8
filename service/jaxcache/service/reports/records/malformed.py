"""Record files a rescan reads (run and warm-up records): the ones changed since read are ingested, the malformed
ones skipped, counted, and logged once per rescan however many there are."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial

from sqlalchemy import delete, or_, select
from sqlalchemy.exc import DataError, IntegrityError

from jaxcache.display import shown
from jaxcache.errors import InvalidInputError, NotRegularFileError, TooLargeError
from jaxcache.parallel import bounded_map
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import RecordFileRow
from jaxcache.service.reports.ingest.usage import chunks
from jaxcache.storage import ObjectInfo, Storage
from jaxcache.storage.base import Stat, name_problem, same_stat
from jaxcache.units import plural

log = logging.getLogger("jaxcache.service")

#: A record's own fault (our schema's or a column's refusal); a database that is down is not caught.
REFUSALS = (InvalidInputError, DataError, IntegrityError)
_CHUNK = 500


def reason(exc: Exception) -> str:
    """Why a record was refused, in one line (the catalog's own message, not its statement)."""
    if isinstance(exc, DataError | IntegrityError):
        said = str(exc.orig).strip().splitlines() if exc.orig is not None else []
        return f"the catalog refused it: {said[0] if said else type(exc).__name__}"
    return str(exc)


def known(catalog: Catalog, cache: str, prefixes: Iterable[str]) -> dict[str, Stat]:
    """The record files under ``prefixes`` read before, with their (size, mtime, version) when read."""
    where = or_(*(RecordFileRow.name.like(prefix + "%") for prefix in prefixes))
    with catalog.reader() as conn:
        return {r.name: (r.size_bytes, r.mtime_s, r.version) for r in conn.execute(
            select(RecordFileRow.name, RecordFileRow.size_bytes, RecordFileRow.mtime_s, RecordFileRow.version)
            .where(RecordFileRow.cache == cache, where))}


def changed(listing: dict[str, ObjectInfo], known: dict[str, Stat]) -> list[ObjectInfo]:
    """The listed files that are new or changed since read (storage's one rule for "the same object"), by name."""
    return [i for n, i in sorted(listing.items()) if (before := known.get(n)) is None or not same_stat(before, (
        i.size_bytes, i.mtime_s, i.version))]


def ingest_files(catalog: Catalog, cache: str, storage: Storage, todo: list[ObjectInfo], *, what: str,
                 max_bytes: int, ingest: Callable[[ObjectInfo, bytes], object]) -> tuple[int, int]:
    """Read each of ``todo`` and ``ingest`` it, remembering each file as read (with why, if skipped); returns how
    many were ingested and how many skipped as malformed."""
    ingested = 0
    skipped: list[tuple[str, str]] = []
    for info, data, error in bounded_map(partial(_read, storage, max_bytes), todo, workers=storage.io_workers):
        if data is None and error is None:
            continue  # deleted since the listing
        if data is not None:
            try:
                ingest(info, data)
                ingested += 1
            except REFUSALS as exc:
                error = reason(exc)
        if error is not None:
            skipped.append((info.name, error))
            log.debug("skipping malformed %s %s: %s", what, shown(info.name), error)
        row = {"cache": cache, "name": info.name, "size_bytes": info.size_bytes, "mtime_s": info.mtime_s,
               "version": info.version, "error": None if error is None else error[:2000]}
        with catalog.session() as s:
            s.execute(catalog.insert(RecordFileRow).values(**row).on_conflict_do_update(
                index_elements=["cache", "name"], set_={k: v for k, v in row.items() if k not in ("cache", "name")}))
    if skipped:
        name, why = skipped[0]
        more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        log.warning("cache %s: skipped %s, each read again only once it changes: %s: %s%s",
                    cache, plural(len(skipped), f"malformed {what}"), shown(name), why, more)
    return ingested, len(skipped)


def forget(catalog: Catalog, cache: str, names: list[str]) -> None:
    """Delete the rows of record files gone from storage: one of the same name is read again."""
    with catalog.session() as s:
        for part in chunks(names, _CHUNK):
            s.execute(delete(RecordFileRow).where(RecordFileRow.cache == cache, RecordFileRow.name.in_(part)))


def _read(storage: Storage, max_bytes: int, info: ObjectInfo) -> tuple[ObjectInfo, bytes | None, str | None]:
    """A record file's bytes, or why it is skipped; (None, None) when deleted since the listing."""
    problem = name_problem(info.name)
    if problem is not None:
        return info, None, problem
    try:
        return info, storage.read_bounded(info.name, max_bytes, listed_bytes=info.size_bytes), None
    except TooLargeError as exc:
        return info, None, str(exc)
    except NotRegularFileError as exc:
        return info, None, f"not a regular file: {exc}"
