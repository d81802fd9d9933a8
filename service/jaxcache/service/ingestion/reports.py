"""Run records into the catalog, one process's record at a time, from ``POST /v1/reports`` and from rescans.

A record is rewritten while its process runs (its counts are totals so far), so ingesting one is an upsert per
(cache, run id, process index): the process's rows are replaced and the aggregates of the keys it touches follow,
as differences where that is exact, else recomputed (:mod:`.aggregates`). Ingesting a record twice, an older
version of one, or one older than the cache's compaction watermark (its run may be in key_history already),
changes nothing. How the figures are defined: docs/service.md, "Run records".
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import msgspec
from sqlalchemy import Update, bindparam, delete, select, update
from sqlalchemy.orm import Session

from jaxcache import records
from jaxcache.attestations import FILE, REPORTED, Attestation, from_run
from jaxcache.errors import InvalidInputError
from jaxcache.records import RunRecord
from jaxcache.service.catalog import rawsql
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import AGGREGATES, CacheRow, KeyStatsRow, RunRow, UsageRow, table_of
from jaxcache.service.ingestion import attestations
from jaxcache.service.ingestion import explain as explaining
from jaxcache.service.ingestion.aggregates import (
    entry_params,
    entry_update_statement,
    hit_at,
    recompute,
    saved_of_row,
    used_hits,
    wrote,
)

_CHUNK = 500
STORAGE, REPORT = "storage", "report"


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What ingesting one record did."""

    cache: str
    run_id: str
    process_index: int
    keys: int  # per-key rows stored for the process
    stale: bool  # a newer version of this record was already ingested: nothing changed
    misses: dict[str, int] = field(default_factory=dict)  # misses explained for the first time, by cause
    pending: tuple[explaining.Pending, ...] = ()  # misses stored unexplained (``explain=False``)


def ingest(catalog: Catalog, cache: str, record: RunRecord, *, source: str = REPORT, secret: bytes | None = None,
           record_name: str | None = None, explain: bool = True) -> IngestResult:
    """Store ``record`` (already parsed) for ``cache``, update the aggregates of the keys it touches, and explain
    its new misses (unless ``explain`` is False: a rescan explains all its records' misses at its end, when every
    record it read is in, whatever order it read them in).

    Raises :class:`InvalidInputError` (and stores nothing) if the record names a key twice.
    """
    check(record)
    counts: dict[str, int] = {}
    aggregates = _Aggregates(cache)
    with catalog.writing(cache) as s:
        result, attest = _ingest_in(s, aggregates, record, source)
        aggregates.flush(s)
        if explain and result.pending:
            counts = dict(explaining.explain_pending(s, cache, result.pending))
            result = replace(result, misses=counts, pending=())
    if counts:
        catalog.count_misses(cache, counts)
    # A POSTed digest came with a report token; one read from the bucket is worth what the bucket's writers are.
    # Recorded for compacted records too: digests are evidence, never counts (the first accepted one counts, the
    # others are kept as conflicts), and a back-dated record must not hide a forged digest.
    found = _attestations(record, source, secret, record_name) if attest else []
    if found:
        attestations.record(catalog, cache, found)
    return result


class PendingMisses:
    """Stored misses not explained yet, by process: a process's later record replaces what its earlier one left
    (its rows were replaced), and whether a miss counts stays what the catalog held before the first of them."""

    def __init__(self) -> None:
        self._by_process: dict[tuple[str, int], dict[str, explaining.Pending]] = {}

    def __len__(self) -> int:
        return sum(len(by_key) for by_key in self._by_process.values())

    def add(self, result: IngestResult) -> None:
        """What ``result`` (not stale) left to explain."""
        process = (result.run_id, result.process_index)
        earlier = self._by_process.get(process, {})
        self._by_process[process] = {p.key: replace(p, counted=earlier[p.key].counted) if p.key in earlier else p
                                     for p in result.pending}

    def take_process(self, run_id: str, process_index: int) -> list[explaining.Pending]:
        """The misses held for that process, which are no longer held."""
        return list(self._by_process.pop((run_id, process_index), {}).values())

    def take(self, limit: int | None = None) -> list[explaining.Pending]:
        """The misses held (whole processes' while at most ``limit``, at least one process's), which are no longer
        held."""
        out: list[explaining.Pending] = []
        for process in list(self._by_process):
            if limit is not None and out and len(out) + len(self._by_process[process]) > limit:
                break
            out += self._by_process.pop(process).values()
        return out


def ingest_batch(catalog: Catalog, cache: str, batch: Sequence[RunRecord], *, source: str = REPORT,
                 secret: bytes | None = None, later: PendingMisses | None = None,
                 copies: set[str] | None = None) -> list[IngestResult]:
    """Ingest several records of ``cache`` in one write transaction, each as :func:`ingest` would, in order, their
    digests recorded in the same transaction. What a job's processes send at once share their keys, so a batch
    reads and writes each key's aggregates once instead of once a record. Their misses are explained together at
    the end (one read of the history for all), or, given ``later``, added to it for the caller to explain
    (:func:`explaining.explain_stored`) once it has time; given ``copies``, likewise the keys whose copies on entry
    rows are due (:func:`aggregates.copy_to_entries`). Any error stores nothing of the batch (the caller tries the
    records one at a time); each record must have passed :func:`check`. The results' ``misses`` stay empty: the
    count goes to the catalog's listener."""
    results: list[IngestResult] = []
    pending = PendingMisses() if later is None else later
    found: list[Attestation] = []
    aggregates = _Aggregates(cache, copies)
    with catalog.writing(cache) as s:
        for record in batch:
            result, attest = _ingest_in(s, aggregates, record, source)
            results.append(result)
            if not result.stale:
                pending.add(result)
            if attest:
                found += _attestations(record, source, secret, None)
        aggregates.flush(s)
        counts = Counter[str]()
        if later is None and (todo := pending.take()):
            counts = explaining.explain_pending(s, cache, todo)
        if found:
            attestations.record_in(catalog, s, cache, found)
    catalog.count_misses(cache, counts)
    return [replace(r, pending=()) for r in results]


def check(record: RunRecord) -> None:
    """Refuse (InvalidInputError) a record the catalog cannot store: one that names a key twice."""
    _unique(record.keys)


def _ingest_in(s: Session, aggregates: _Aggregates, record: RunRecord, source: str) -> tuple[IngestResult, bool]:
    """One record in ``s``'s write transaction, its misses stored unexplained (``pending``); and whether its
    digests are to be recorded (not for an older version of a record already in)."""
    cache = aggregates.cache
    run = s.get(RunRow, (cache, record.run_id, record.process_index))
    if run is not None and run.updated_s > record.updated_at:
        return IngestResult(cache, record.run_id, record.process_index, run.keys, stale=True), False
    if run is None and _compacted(s, cache, record):
        return IngestResult(cache, record.run_id, record.process_index, 0, stale=True), True
    stored, pending = _store(s, aggregates, record, run, source)
    return IngestResult(cache, record.run_id, record.process_index, stored, stale=False,
                        pending=tuple(pending)), True


def _attestations(record: RunRecord, source: str, secret: bytes | None, name: str | None) -> list[Attestation]:
    kind = REPORTED if source == REPORT else FILE
    return list(from_run(record, source=kind, at=time.time(), secret=secret, record=name))


def _store(s: Session, aggregates: _Aggregates, record: RunRecord, run: RunRow | None,
           source: str) -> tuple[int, list[explaining.Pending]]:
    """Replace the process's run and usage rows with ``record``'s and update its keys' aggregates; the rows
    stored, and the misses among them to explain (the others keep the explanation their earlier row had)."""
    cache = aggregates.cache
    where = (UsageRow.cache == cache, UsageRow.run_id == record.run_id,
             UsageRow.process_index == record.process_index)
    old = {r.key: r for r in s.execute(select(*_OWN).where(*where))}
    explained = {} if run is None else _explained(s, cache, record)
    same_run = run is not None and all(getattr(run, n) == v for n, v in _explained_run_fields(record).items())
    s.execute(delete(UsageRow).where(*where))
    fields = _run_fields(record, source)
    if run is None:
        s.add(RunRow(cache=cache, run_id=record.run_id, process_index=record.process_index, **fields))
    else:
        for name, value in fields.items():
            setattr(run, name, value)
    s.flush()
    rows = [_usage_row(cache, record, u) for u in record.keys]
    pending = []
    for row in rows:
        if explaining.is_miss(row["kind"], row["event"]):
            before = explained.get(row["key"])
            kept = explaining.carried(before, row, same_run)
            if kept is None:
                pending.append(explaining.Pending(record.run_id, record.process_index, row["key"],
                                                  counted=before is None or before["cause"] is None))
            else:
                row.update(kept)
    full = _update_in_place(s, aggregates, record, old, {r["key"]: r for r in rows})
    rawsql.insert_rows(s.connection(), table_of(UsageRow), [_as_params(r) for r in rows])
    if full:
        aggregates.flush(s)  # what recompute reads must not lag behind this transaction's own changes
        recompute(s, cache, full)
        aggregates.forget(full)
    return len(rows), pending


def _compacted(s: Session, cache: str, record: RunRecord) -> bool:
    """Whether ``record`` is older than the cache's compaction watermark: its run may be in key_history already
    (a run with a row here is newer than the watermark, so only new runs need this read)."""
    watermark = s.scalar(select(CacheRow.compacted_before_s).where(CacheRow.name == cache))
    return watermark is not None and record.updated_at < watermark


_OWN = (UsageRow.key, UsageRow.kind, UsageRow.event, UsageRow.hits, UsageRow.writes, UsageRow.first_at,
        UsageRow.last_at, UsageRow.saved_s)


class _Aggregates:
    """The aggregates of the keys a transaction's records touch, as those records leave them: each key is read
    once and written once (at :meth:`flush`), however many of the transaction's records touch it; the processes of
    one job touch the same keys."""

    def __init__(self, cache: str, copies: set[str] | None = None) -> None:
        self.cache = cache
        self._rows: dict[str, dict | None] = {}  # None: the key has no aggregates yet
        self._dirty: set[str] = set()
        self._copies = copies  # None: copy onto entry rows at flush

    def get(self, s: Session, keys: list[str]) -> dict[str, dict | None]:
        missing = [k for k in keys if k not in self._rows]
        for i in range(0, len(missing), _CHUNK):
            chunk = missing[i : i + _CHUNK]
            self._rows.update(dict.fromkeys(chunk))
            for r in s.execute(select(KeyStatsRow.key, *(getattr(KeyStatsRow, n) for n in AGGREGATES))
                               .where(KeyStatsRow.cache == self.cache, KeyStatsRow.key.in_(chunk))):
                self._rows[r[0]] = dict(zip(AGGREGATES, r[1:], strict=True))
        return {k: self._rows[k] for k in keys}

    def put(self, key: str, stats: dict) -> None:
        self._rows[key] = stats
        self._dirty.add(key)

    def forget(self, keys: set[str]) -> None:
        """``keys`` were recomputed in the database: read them again when next touched."""
        for key in keys:
            self._rows.pop(key, None)
            self._dirty.discard(key)

    def flush(self, s: Session) -> None:
        """Write the changed keys' aggregates, and their copies on entry rows."""
        if not self._dirty:
            return
        changed: list[tuple[str, dict]] = []
        for key in sorted(self._dirty):
            stats = self._rows[key]
            assert stats is not None  # put() stores a dict
            changed.append((key, stats))
        conn = s.connection()
        rawsql.execute_many(conn, "ingest-key-stats", _stats_update, [
            {"b_cache": self.cache, "b_key": key, "b_hits": stats["hits"], "b_saved_s": stats["saved_s"],
             "b_last_hit_s": stats["last_hit_s"]} for key, stats in changed])
        if self._copies is None:
            rawsql.execute_many(conn, "ingest-entry-copy", _entry_copy,
                                [{"b_cache": self.cache, **entry_params(key, stats)} for key, stats in changed])
        else:  # the caller copies them later, from key_stats as it is then
            self._copies.update(self._dirty)
        self._dirty.clear()


def _update_in_place(s: Session, aggregates: _Aggregates, record: RunRecord, old: dict,
                     new: dict[str, dict]) -> set[str]:
    """Apply one process's replaced rows to its keys' aggregates as differences, which costs the size of the record
    rather than every process's rows of each key. Sets each new row's ``saved_s``. Returns the keys that need a
    full :func:`recompute` instead: no aggregates yet, a first writer that changes or is this very process (its
    compile seconds weigh every reader's row), or a last hit that could move back."""
    me = (record.run_id, record.process_index)
    touched = sorted(set(old) | set(new))
    full: set[str] = set()
    current = aggregates.get(s, touched)
    for key in touched:
        ks, before, after = current[key], old.get(key), new.get(key)
        if ks is None:
            full.add(key)
            continue
        writer = (ks["writer_at_s"], ks["writer_run"], ks["writer_process"]) if ks["writer_run"] is not None else None
        if before is not None and wrote(before.event, before.writes) and writer and writer[1:] == me:
            full.add(key)
            continue
        if after is not None and wrote(after["event"], after["writes"]):
            mine = (after["first_at"] or record.started_at, *me)
            if writer is None or mine < writer:
                full.add(key)
                continue
        # A record's kind may differ from its earlier version's: each side counts by its own.
        old_used = used_hits(before.kind, before.hits) if before is not None else 0
        new_used = used_hits(after["kind"], after["hits"]) if after is not None else 0
        old_hit = hit_at(old_used, before.first_at, before.last_at) if before is not None else None
        new_hit = hit_at(new_used, after["first_at"], after["last_at"]) if after is not None else None
        if old_hit is not None and old_hit == ks["last_hit_s"] and (new_hit is None or new_hit < old_hit):
            full.add(key)
            continue
        saved = 0.0
        if after is not None:
            saved = after["saved_s"] = saved_of_row(new_used, after["retrieval_s"], after["jax_saved_s"],
                                                  ks["writer_compile_s"])
        delta_hits = new_used - old_used
        delta_saved = saved - (before.saved_s if before else 0.0)
        last_hit = ks["last_hit_s"] if new_hit is None or (ks["last_hit_s"] or 0) >= new_hit else new_hit
        if not delta_hits and not delta_saved and last_hit == ks["last_hit_s"]:
            continue
        aggregates.put(key, {**ks, "hits": ks["hits"] + delta_hits, "saved_s": ks["saved_s"] + delta_saved,
                             "last_hit_s": last_hit})
    return full


def _stats_update() -> Update:
    table = table_of(KeyStatsRow)
    return (update(table).where(table.c.cache == bindparam("b_cache"), table.c.key == bindparam("b_key"))
            .values(hits=bindparam("b_hits"), saved_s=bindparam("b_saved_s"), last_hit_s=bindparam("b_last_hit_s")))


def _entry_copy() -> Update:
    return entry_update_statement(bindparam("b_cache"))


#: The usage columns whose values are JSON: written as their text (rawsql binds no type processors).
_JSON_COLUMNS = ("parts", "program", "differs")


def _as_params(row: dict) -> dict:
    out = dict(row)
    for name in _JSON_COLUMNS:
        if out[name] is not None:
            out[name] = msgspec.json.encode(out[name]).decode()
    return out


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
        "backend": fp.backend, "fingerprint": msgspec.structs.asdict(fp), "fingerprint_digest": fp.digest,
        "started_s": record.started_at, "updated_s": record.updated_at, "final": record.final, "pid": record.pid,
        "keys": len(record.keys), "source": source, "ingested_s": time.time(), "kind": record.kind,
    }


def _explained(s: Session, cache: str, record: RunRecord) -> dict[str, dict]:
    """The process's stored misses with what their explanations were made of, by key."""
    rows = rawsql.fetch(s.connection(), "ingest-explained", explaining.stored_statement,
                        {"cache": cache, "run_id": record.run_id, "process_index": record.process_index})
    return {r[0]: explaining.as_stored(r) for r in rows}


def _explained_run_fields(record: RunRecord) -> dict:
    """What an explanation reads of the run besides the usage row: a change re-explains its misses."""
    return {"fingerprint_digest": record.fingerprint.digest, "topology": record.topology,
            "started_s": record.started_at, "job": record.job, "kind": record.kind}


def _usage_row(cache: str, record: RunRecord, u: records.KeyUsage) -> dict:
    return {
        "cache": cache, "run_id": record.run_id, "process_index": record.process_index, "key": u.key,
        "job": record.job, "kind": record.kind, "function": u.function, "event": u.event, "hits": u.hits,
        "compiles": u.compiles, "writes": u.writes, "reason": u.reason, "compile_s": u.compile_s,
        "retrieval_s": u.retrieval_s, "jax_saved_s": u.saved_s, "saved_s": 0.0, "size_bytes": u.size_bytes,
        "first_at": u.first_at, "last_at": u.last_at,
        "parts": None if u.parts is None else msgspec.to_builtins(u.parts),
        "program": None if u.program is None else msgspec.to_builtins(u.program),
        "cause": None, "differs": None, "nearest": None, "fix": None,
    }
