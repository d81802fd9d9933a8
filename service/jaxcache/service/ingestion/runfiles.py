"""Run records on storage (``<root>/.jaxcache/runs/``): a rescan ingests those that are new or changed."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial

from sqlalchemy import delete, select

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.parallel import bounded_map
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import RecordFileRow, max_length
from jaxcache.service.ingestion.reports import STORAGE, ingest
from jaxcache.storage import ObjectInfo, Storage

log = logging.getLogger("jaxcache.service")

_CHUNK = 500
_NAME_MAX = max_length(RecordFileRow.__table__.c.name)  # longer: not a record jaxcache wrote


@dataclass(frozen=True, slots=True)
class RecordScan:
    """What a rescan did with a root's run records."""

    ingested: int
    malformed: int
    unchanged: int


def _read(storage: Storage, info: ObjectInfo) -> tuple[ObjectInfo, bytes | None, str | None]:
    if info.size_bytes > records.MAX_RECORD_BYTES:
        return info, None, f"larger than {records.MAX_RECORD_BYTES} bytes"
    return info, storage.read(info.name), None


def scan_records(catalog: Catalog, cache: str, storage: Storage, *, secret: bytes | None = None) -> RecordScan:
    """Ingest the run records under ``<root>/.jaxcache/runs/`` that are new or changed since the last rescan.

    A malformed record is skipped with one warning (it is read again only once it changes). Records that vanish
    from storage keep their runs in the catalog: reports are history that only the catalog holds.
    """
    listing = {i.name: i for i in storage.iter_objects(records.RUNS_PREFIX, recursive=True)
               if records.is_record_name(i.name) and len(i.name) <= _NAME_MAX}
    with catalog.reader() as conn:
        known = {r.name: (r.size_bytes, r.mtime_s, r.generation) for r in conn.execute(
            select(RecordFileRow.name, RecordFileRow.size_bytes, RecordFileRow.mtime_s, RecordFileRow.generation)
            .where(RecordFileRow.cache == cache, RecordFileRow.name.like(records.RUNS_PREFIX + "%")))}
    vanished = [n for n in known if n not in listing]
    todo = [i for n, i in sorted(listing.items()) if known.get(n) != (i.size_bytes, i.mtime_s, i.generation)]
    ingested = malformed = 0
    for info, data, error in bounded_map(partial(_read, storage), todo, workers=storage.io_workers):
        if data is None and error is None:
            continue  # deleted since the listing
        if data is not None and error is None:
            try:
                record = records.parse(data)
                ingest(catalog, cache, record, source=STORAGE, secret=secret, record_name=info.name)
            except InvalidInputError as exc:
                error = str(exc)
        if error is not None:
            malformed += 1
            log.warning("cache %s: skipping malformed run record %s: %s", cache, info.name, error)
        else:
            ingested += 1
        row = {"cache": cache, "name": info.name, "size_bytes": info.size_bytes, "mtime_s": info.mtime_s,
               "generation": info.generation, "error": None if error is None else error[:2000]}
        with catalog.session() as s:
            s.execute(catalog.insert(RecordFileRow).values(**row).on_conflict_do_update(
                index_elements=["cache", "name"], set_={k: v for k, v in row.items() if k not in ("cache", "name")}))
    if vanished:
        with catalog.session() as s:
            for i in range(0, len(vanished), _CHUNK):
                s.execute(delete(RecordFileRow).where(RecordFileRow.cache == cache,
                                                      RecordFileRow.name.in_(vanished[i : i + _CHUNK])))
    return RecordScan(ingested, malformed, len(listing) - len(todo))
