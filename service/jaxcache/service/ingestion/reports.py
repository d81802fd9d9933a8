"""Run records into the catalog: from ``POST /v1/reports`` and from the ``.jaxcache/runs/`` objects a rescan finds.

A record is rewritten in place while its process runs (counts are totals so far), so ingestion is an upsert per
(cache, run id, process index): the process's per-key rows are replaced and the aggregates of every key it
touches, now or before, follow. Mostly as differences (new row minus old row: the cost of one record, however many
processes share a key); from all rows of the key when the first writer may change or the last hit may move back.
Either way the result equals a recomputation from scratch. Ingesting the same record twice changes nothing; an
older version of a record than the one already ingested is ignored.

Replicas sharing a catalog ingest at the same time: each record is one transaction under the cache's write lock
(:meth:`Catalog.writing`), so aggregates are read and written by one ingestion at a time and none is lost.

Seconds saved by hits: for each process that hit a key, ``hits x writer's measured compile seconds - retrieval
seconds`` when the key's first writer measured its compile and that is positive; otherwise JAX's own figure
(stored whole seconds minus retrieval), clipped at 0. Summed over a key's processes this is ``hits x (compile_s -
mean retrieval_s)``. A writer's record may arrive after its readers', so the figure of every row of a key is
recomputed with the key's aggregates.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import partial

from sqlalchemy import Float, and_, bindparam, case, cast, delete, insert, select, update
from sqlalchemy.orm import Session

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.parallel import bounded_map
from jaxcache.records import RunRecord
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import AGGREGATES, EntryRow, KeyStatsRow, RecordFileRow, RunRow, UsageRow
from jaxcache.service.ingestion import attestations
from jaxcache.storage import ObjectInfo, Storage

log = logging.getLogger("jaxcache.service")

_CHUNK = 500
_NAME_MAX = RecordFileRow.__table__.c.name.type.length  # longer: not a record jaxcache wrote
STORAGE, REPORT = "storage", "report"


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What ingesting one record did."""

    cache: str
    run_id: str
    process_index: int
    keys: int  # per-key rows stored for the process
    stale: bool  # a newer version of this record was already ingested: nothing changed


@dataclass(frozen=True, slots=True)
class RecordScan:
    """What a rescan did with a root's run records."""

    ingested: int
    malformed: int
    unchanged: int


def ingest(catalog: Catalog, cache: str, record: RunRecord, *, source: str = REPORT) -> IngestResult:
    """Store ``record`` (already parsed) for ``cache`` and update the aggregates of the keys it touches.

    Raises :class:`InvalidInputError` (and stores nothing) if the record names a key twice.
    """
    usages = _unique(record.keys)
    pk = (cache, record.run_id, record.process_index)
    with catalog.writing(cache) as s:
        run = s.get(RunRow, pk)
        if run is not None and run.updated_s > record.updated_at:
            return IngestResult(cache, record.run_id, record.process_index, run.keys, stale=True)
        where = (UsageRow.cache == cache, UsageRow.run_id == record.run_id,
                 UsageRow.process_index == record.process_index)
        old = {r.key: r for r in s.execute(select(*_OWN).where(*where))}
        s.execute(delete(UsageRow).where(*where))
        fields = _run_fields(record, source)
        if run is None:
            s.add(RunRow(cache=cache, run_id=record.run_id, process_index=record.process_index, **fields))
        else:
            for name, value in fields.items():
                setattr(run, name, value)
        s.flush()
        rows = [_usage_row(cache, record, u) for u in usages]
        full = _update_in_place(s, cache, record, old, {r["key"]: r for r in rows})
        for i in range(0, len(rows), 5000):
            s.execute(insert(UsageRow), rows[i : i + 5000])
        if full:
            recompute(s, cache, full)
    attestations.record(catalog, cache, attestations.from_run(record))
    return IngestResult(cache, record.run_id, record.process_index, len(rows), stale=False)


_OWN = (UsageRow.key, UsageRow.event, UsageRow.hits, UsageRow.writes, UsageRow.first_at, UsageRow.last_at,
        UsageRow.saved_s)


def _writes(event: str, writes: int) -> bool:
    return writes > 0 or event == records.WRITE


def _last_hit(hits: int, first_at: float, last_at: float) -> float | None:
    return (last_at or first_at or None) if hits else None


def _update_in_place(s: Session, cache: str, record: RunRecord, old: dict, new: dict[str, dict]) -> set[str]:
    """Apply one process's replaced rows to its keys' aggregates as differences, which costs the size of the record
    rather than every process's rows of each key. Sets each new row's ``saved_s``. Returns the keys that need a
    full :func:`recompute` instead: no aggregates yet, a first writer that changes or is this very process (its
    compile seconds weigh every reader's row), or a last hit that could move back."""
    me = (record.run_id, record.process_index)
    touched = sorted(set(old) | set(new))
    full: set[str] = set()
    stats_updates, entry_params = [], []
    for i in range(0, len(touched), _CHUNK):
        chunk = touched[i : i + _CHUNK]
        current = {r.key: r for r in s.execute(select(KeyStatsRow.key, *(getattr(KeyStatsRow, n) for n in AGGREGATES))
                                              .where(KeyStatsRow.cache == cache, KeyStatsRow.key.in_(chunk)))}
        for key in chunk:
            ks, before, after = current.get(key), old.get(key), new.get(key)
            if ks is None:
                full.add(key)
                continue
            writer = (ks.writer_at_s, ks.writer_run, ks.writer_process) if ks.writer_run is not None else None
            if before is not None and _writes(before.event, before.writes) and writer and writer[1:] == me:
                full.add(key)
                continue
            if after is not None and _writes(after["event"], after["writes"]):
                mine = (after["first_at"] or record.started_at, *me)
                if writer is None or mine < writer:
                    full.add(key)
                    continue
            old_hit = _last_hit(before.hits, before.first_at, before.last_at) if before is not None else None
            new_hit = _last_hit(after["hits"], after["first_at"], after["last_at"]) if after is not None else None
            if old_hit is not None and old_hit == ks.last_hit_s and (new_hit is None or new_hit < old_hit):
                full.add(key)
                continue
            saved = 0.0
            if after is not None:
                saved = after["saved_s"] = _row_saved(after["hits"], after["retrieval_s"], after["jax_saved_s"],
                                                      ks.writer_compile_s)
            delta_hits = (after["hits"] if after else 0) - (before.hits if before else 0)
            delta_saved = saved - (before.saved_s if before else 0.0)
            last_hit = ks.last_hit_s if new_hit is None or (ks.last_hit_s or 0) >= new_hit else new_hit
            if not delta_hits and not delta_saved and last_hit == ks.last_hit_s:
                continue
            stats = dict(zip(AGGREGATES, ks[1:], strict=True))
            stats.update(hits=ks.hits + delta_hits, saved_s=ks.saved_s + delta_saved, last_hit_s=last_hit)
            stats_updates.append({"b_key": key, "b_hits": stats["hits"], "b_saved_s": stats["saved_s"],
                                  "b_last_hit_s": last_hit})
            entry_params.append({"b_key": key, **{f"b_{n}": stats[n] for n in AGGREGATES}})
    if stats_updates:
        table = KeyStatsRow.__table__
        s.connection().execute(
            update(table).where(table.c.cache == cache, table.c.key == bindparam("b_key"))
            .values(hits=bindparam("b_hits"), saved_s=bindparam("b_saved_s"), last_hit_s=bindparam("b_last_hit_s")),
            stats_updates,
        )
        s.connection().execute(_entry_update(cache), entry_params)
    return full


def _unique(usages: list[records.KeyUsage]) -> list[records.KeyUsage]:
    seen: set[str] = set()
    for u in usages:
        if u.key in seen:
            raise InvalidInputError(f"run record lists key {u.key!r} twice: one entry per key")
        seen.add(u.key)
    return usages


def _run_fields(record: RunRecord, source: str) -> dict:
    fp = record.fingerprint
    return {
        "job": record.job, "process_count": record.process_count, "host": record.host,
        "topology": record.topology, "cache_dir": record.cache_dir, "jax": fp.jax, "jaxlib": fp.jaxlib,
        "backend": fp.backend, "fingerprint": asdict(fp), "fingerprint_digest": fp.digest,
        "started_s": record.started_at, "updated_s": record.updated_at, "final": record.final, "pid": record.pid,
        "keys": len(record.keys), "source": source, "ingested_s": time.time(),
    }


def _usage_row(cache: str, record: RunRecord, u: records.KeyUsage) -> dict:
    return {
        "cache": cache, "run_id": record.run_id, "process_index": record.process_index, "key": u.key,
        "job": record.job, "function": u.function, "event": u.event, "hits": u.hits, "compiles": u.compiles,
        "writes": u.writes, "reason": u.reason, "compile_s": u.compile_s, "retrieval_s": u.retrieval_s,
        "jax_saved_s": u.saved_s, "saved_s": 0.0, "size_bytes": u.size_bytes, "first_at": u.first_at,
        "last_at": u.last_at,
    }


def _row_saved(hits: int, retrieval_s: float, jax_saved_s: float, writer_compile_s: float | None) -> float:
    if not hits:
        return 0.0
    if writer_compile_s is not None:
        ours = hits * writer_compile_s - retrieval_s
        if ours > 0:
            return ours
    return max(jax_saved_s, 0.0)


_JOIN = and_(RunRow.cache == UsageRow.cache, RunRow.run_id == UsageRow.run_id,
             RunRow.process_index == UsageRow.process_index)
_COLUMNS = (
    UsageRow.key, UsageRow.run_id, UsageRow.process_index, UsageRow.job, UsageRow.event, UsageRow.hits,
    UsageRow.writes, UsageRow.compile_s, UsageRow.retrieval_s, UsageRow.jax_saved_s, UsageRow.saved_s,
    UsageRow.first_at, UsageRow.last_at, RunRow.host, RunRow.topology, RunRow.jax, RunRow.jaxlib, RunRow.started_s,
)


def aggregate(rows: Iterable) -> tuple[dict, list[tuple[str, int, float]]]:
    """Aggregates of one key from its usage rows (joined with their runs), and ``(run_id, process_index,
    saved_s)`` for each row whose saved seconds change."""
    rows = list(rows)
    writes = [r for r in rows if r.writes > 0 or r.event == records.WRITE]
    # The earliest write; a record without first_at (0) falls back to its process's start.
    writer = min(writes, key=lambda r: (r.first_at or r.started_s, r.run_id, r.process_index), default=None)
    writer_compile_s = writer.compile_s if writer is not None else None
    hits = 0
    last_hit: float | None = None
    saved = 0.0
    changed = []
    for r in rows:
        row_saved = _row_saved(r.hits, r.retrieval_s, r.jax_saved_s, writer_compile_s)
        if row_saved != r.saved_s:
            changed.append((r.run_id, r.process_index, row_saved))
        saved += row_saved
        if r.hits:
            hits += r.hits
            at = _last_hit(r.hits, r.first_at, r.last_at)
            if at is not None and (last_hit is None or at > last_hit):
                last_hit = at
    stats = {
        "hits": hits, "last_hit_s": last_hit, "saved_s": saved,
        "writer_job": writer.job if writer else None, "writer_run": writer.run_id if writer else None,
        "writer_process": writer.process_index if writer else None, "writer_host": writer.host if writer else None,
        "writer_topology": writer.topology if writer else None, "writer_jax": writer.jax if writer else None,
        "writer_jaxlib": writer.jaxlib if writer else None,
        "writer_at_s": (writer.first_at or writer.started_s) if writer else None,
        "writer_compile_s": writer_compile_s,
    }
    return stats, changed


EMPTY = {name: None for name in AGGREGATES} | {"hits": 0, "saved_s": 0.0}


def _entry_update(cache: str):
    """UPDATE of an entry row's copy of its key's aggregates (parameters ``b_key`` and ``b_<aggregate>``); its last
    use becomes the newer of what storage shows and the last hit."""
    entries = EntryRow.__table__
    # Typed on the server too: PostgreSQL cannot infer the type of a parameter that is only tested for NULL.
    hit = cast(bindparam("b_last_hit_s", type_=Float), Float)
    return (
        update(entries)
        .where(entries.c.cache == cache, entries.c.key == bindparam("b_key"), entries.c.kind == "entry")
        .values(
            **{name: bindparam(f"b_{name}") for name in AGGREGATES},
            last_used_s=case((and_(hit.is_not(None), hit > entries.c.seen_used_s), hit),
                             else_=entries.c.seen_used_s),
        )
    )


def recompute(s: Session, cache: str, keys: Iterable[str]) -> None:
    """Recompute ``key_stats``, per-row saved seconds and the copies on entry rows for ``keys`` of ``cache``."""
    keys = sorted(set(keys))
    entry_update = _entry_update(cache)
    usage = UsageRow.__table__
    saved_update = (
        update(usage)
        .where(usage.c.cache == cache, usage.c.key == bindparam("b_key"), usage.c.run_id == bindparam("b_run"),
               usage.c.process_index == bindparam("b_process"))
        .values(saved_s=bindparam("b_saved"))
    )
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i : i + _CHUNK]
        by_key: dict[str, list] = {}
        for r in s.execute(select(*_COLUMNS).join(RunRow, _JOIN).where(UsageRow.cache == cache,
                                                                         UsageRow.key.in_(chunk))):
            by_key.setdefault(r.key, []).append(r)
        stats_rows, entry_params, saved_params = [], [], []
        for key in chunk:
            rows = by_key.get(key)
            if rows:
                stats, changed = aggregate(rows)
                stats_rows.append({"cache": cache, "key": key, **stats})
                saved_params += [{"b_key": key, "b_run": run, "b_process": p, "b_saved": v} for run, p, v in changed]
            else:
                stats = EMPTY
            entry_params.append({"b_key": key, **{f"b_{n}": stats[n] for n in AGGREGATES}})
        s.execute(delete(KeyStatsRow).where(KeyStatsRow.cache == cache, KeyStatsRow.key.in_(chunk)))
        if stats_rows:
            s.execute(insert(KeyStatsRow), stats_rows)
        conn = s.connection()
        if saved_params:
            conn.execute(saved_update, saved_params)
        conn.execute(entry_update, entry_params)


def key_stats(s: Session, cache: str, keys: list[str]) -> dict[str, dict]:
    """``{key: aggregates}`` for those of ``keys`` that reports mention (for entry rows a rescan adds)."""
    out: dict[str, dict] = {}
    cols = [getattr(KeyStatsRow, n) for n in AGGREGATES]
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i : i + _CHUNK]
        for row in s.execute(select(KeyStatsRow.key, *cols).where(KeyStatsRow.cache == cache,
                                                                   KeyStatsRow.key.in_(chunk))):
            out[row[0]] = dict(zip(AGGREGATES, row[1:], strict=True))
    return out


# --------------------------------------------------------------------------------------------------------------
# Records on storage


def _read(storage: Storage, info: ObjectInfo) -> tuple[ObjectInfo, bytes | None, str | None]:
    if info.size_bytes > records.MAX_RECORD_BYTES:
        return info, None, f"larger than {records.MAX_RECORD_BYTES} bytes"
    return info, storage.read(info.name), None


def scan_records(catalog: Catalog, cache: str, storage: Storage) -> RecordScan:
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
        if error is None:
            try:
                record = records.parse(data)
                ingest(catalog, cache, record, source=STORAGE)
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


# --------------------------------------------------------------------------------------------------------------
# Which cache a report is for


def _normal_dir(text: str) -> str | None:
    """A cache_dir or root URL in the form roots are compared in: ``gs://b/p`` without a trailing slash, or the
    real path of an absolute directory. None for anything else (a relative path means nothing here)."""
    if text.startswith("gs://"):
        return text.rstrip("/")
    if text.startswith("file://"):
        text = text[len("file://") :]
    if not os.path.isabs(text):
        return None
    return os.path.realpath(text)


def roots_by_dir(urls: Mapping[str, str]) -> dict[str, list[str]]:
    """``{normalised root: [cache names]}`` for the configured caches (several names may share a root)."""
    out: dict[str, list[str]] = {}
    for name, url in urls.items():
        norm = _normal_dir(url)
        if norm is not None:
            out.setdefault(norm, []).append(name)
    return out


def cache_for(record: RunRecord, roots: Mapping[str, list[str]]) -> str:
    """The configured cache ``record.cache_dir`` names. Raises :class:`InvalidInputError` saying to pass
    ``?cache=`` when it names none, or several."""
    return cache_for_dir(record.cache_dir, roots)


def cache_for_dir(cache_dir: str | None, roots: Mapping[str, list[str]]) -> str:
    """The configured cache whose root is ``cache_dir`` (as a job spells it); see :func:`cache_for`."""
    norm = _normal_dir(cache_dir) if cache_dir else None
    names = roots.get(norm, []) if norm is not None else []
    if len(names) == 1:
        return names[0]
    if not names:
        said = f"cache_dir {cache_dir!r}" if cache_dir else "no cache_dir"
        raise InvalidInputError(f"the record has {said}, which is not the root of any configured cache: "
                                "pass ?cache=NAME (GET /v1/caches lists them)")
    raise InvalidInputError(f"cache_dir {cache_dir!r} is the root of caches {', '.join(sorted(names))}: "
                            "pass ?cache=NAME")