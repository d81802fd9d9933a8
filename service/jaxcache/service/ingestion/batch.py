"""One write transaction's run records into the catalog: which are new or newer than what is stored, then, once
per batch, their processes' figures and run rows, their runs' usage rows (changed in place where that is exact,
else rebuilt from every process's figures), their keys' aggregates, and which misses are left to explain.
docs/service.md, "Run records"."""

from __future__ import annotations

import functools
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec
from sqlalchemy import Delete, Select, Update, bindparam, case, delete, literal, select, update
from sqlalchemy.orm import Session

from jaxcache.records import KeyUsage, RunRecord
from jaxcache.service.catalog import rawsql
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import CacheRow, ProcessKeysRow, RunRow, UsageRow, table_of
from jaxcache.service.ingestion import aggregates, groups
from jaxcache.service.ingestion import explain as explaining
from jaxcache.service.ingestion import figures as f
from jaxcache.service.ingestion.changes import Change, Stored, Writer, first_writers, weigh
from jaxcache.service.ingestion.explain import Pending
from jaxcache.service.ingestion.packed import Report
from jaxcache.service.ingestion.stacked import Work

_CHUNK = 500
_json = msgspec.json.Encoder()


#: What ingestion reads of a process's run row.
RUN = ("job", "kind", "updated_s", "started_s", "keys", *explaining.RUN_INPUTS)
_RUN_COLUMNS = tuple(getattr(RunRow, n) for n in RUN)


class Batch:
    """One write transaction's records: which are new or newer than what is stored (:meth:`take`), then everything
    they change, once per batch (:meth:`apply`)."""

    def __init__(self, catalog: Catalog, s: Session, cache: str, source: str) -> None:
        self.catalog, self.s, self.cache, self.source = catalog, s, cache, source
        self.conn = s.connection()
        self._stored: dict[tuple[str, int], Stored] = {}
        self._latest: dict[tuple[str, int], Report] = {}
        self._watermark: float | None | bool = False  # False: not read yet

    def load(self, batch: Sequence[Report]) -> None:
        """Read what the catalog holds of the processes of ``batch``: their run rows and figures. Two reads, not a
        join: on PostgreSQL, until its tables were analyzed (a minute after a job's start filled them), the join
        scanned every process of the run for each one read."""
        by_run: dict[str, set[int]] = defaultdict(set)
        for r in batch:
            by_run[r.run_id].add(r.process_index)
        for run_id, indexes in sorted(by_run.items()):
            params, wanted = {"cache": self.cache, "run_id": run_id}, sorted(indexes)
            runs = rawsql.fetch_in(self.conn, "ingest-processes", _processes_statement, params, wanted)
            if not runs:
                continue
            figures = dict(rawsql.fetch_in(self.conn, "ingest-figures", _figures_statement, params,
                                           [row[0] for row in runs], binary=True))
            for row in runs:
                packed = figures.get(row[0])
                self._stored[(run_id, row[0])] = Stored(dict(zip(RUN, row[1:], strict=True)),
                                                        f.EMPTY if packed is None else f.decode(bytes(packed)))

    def take(self, report: Report) -> tuple[bool, int, bool]:
        """Whether ``report`` is stale (an older version than one ingested: it changes nothing), the keys stored
        for its process, and whether its digests are to be recorded (not for an older version of a record in)."""
        pid = (report.run_id, report.process_index)
        latest = self._latest.get(pid)
        stored = self._stored.get(pid)
        updated = report.header.updated_at
        if latest is not None and latest.header.updated_at > updated:
            return True, len(latest.keys), False
        if latest is None and stored is not None and stored.run["updated_s"] > updated:
            return True, stored.run["keys"], False
        if latest is None and stored is None and self._compacted(report.header):
            return True, 0, True
        self._latest[pid] = report
        return False, len(report.keys), True

    def _compacted(self, record: RunRecord) -> bool:
        """Whether ``record`` is older than the cache's compaction watermark: its run may be in key_history already
        (a run with a row here is newer than the watermark, so only new runs need this read)."""
        if self._watermark is False:
            found = rawsql.fetch(self.conn, "ingest-watermark", _watermark_statement, {"cache": self.cache})
            self._watermark = found[0][0] if found else None
        return self._watermark is not None and record.updated_at < self._watermark

    def apply(self) -> tuple[list[Pending], Counter[str]]:
        """Store what the records taken change; the usage rows of misses left to explain, and the misses counted
        (those that joined a row explained already)."""
        changes = {pid: Change(self._stored.get(pid), r.header, r.figures, r) for pid, r in self._latest.items()}
        if not changes:
            return [], Counter()
        keys = sorted({k for c in changes.values() for k in c.figures.keys}
                      | {k for c in changes.values() if c.before is not None for k in c.before.figures.keys})
        stats = aggregates.key_stats(self.s, self.cache, keys)
        writers, measure, full = first_writers(changes, stats)
        for c in changes.values():
            weigh(c, measure)
        work = Work(changes)
        idents = work.idents()
        keyed = _Keyed()
        pending, counts, rebuild = self._update(self._rows(idents), idents, work, changes, keyed)
        self._store_processes(changes)
        for run_id, which in sorted(rebuild.items()):
            rebuilt = aggregates.rebuild(self.s, self.cache, run_id, which)
            missed = [(key, job, kind) for (key, job, kind), row in rebuilt.items()
                      if row is not None and f.is_miss(kind, row["event"])]
            # Explained again: what a rebuilt row's explanation was made of may have changed.
            rawsql.execute_many(self.conn, "ingest-unexplain", _unexplain, [
                _ident(self.cache, run_id, key, job, kind) for key, job, kind in missed])
            pending += [Pending(run_id, job, key) for key, job, _ in missed]
            keyed.regather.update(key for key, _, _ in which)
        self._store_stats(keys, stats, writers, full, keyed)
        return pending, counts

    # --- usage rows -------------------------------------------------------------------------------------------

    def _rows(self, idents: list[tuple[str, str, str, str]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
        """The usage rows the batch touches, as stored: ``{(run_id, key, job, kind): columns}``."""
        by_run: dict[str, set[str]] = defaultdict(set)
        for run_id, key, _, _ in idents:
            by_run[run_id].add(key)
        out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        names = _READ
        for run_id, found in sorted(by_run.items()):
            for values in rawsql.fetch_in(self.conn, "ingest-usage", _usage_statement,
                                          {"cache": self.cache, "run_id": run_id}, sorted(found)):
                row = dict(zip(names, values, strict=True))
                out[(run_id, row["key"], row["job"], row["kind"])] = row
        return out

    def _update(self, rows: dict, idents: list[tuple[str, str, str, str]], work: Work,
                changes: dict[tuple[str, int], Change], keyed: _Keyed
                ) -> tuple[list[Pending], Counter[str], dict[str, set[tuple[str, str, str]]]]:
        """Apply the batch's parts to its usage rows and write them, noting what their keys' aggregates gain
        (``keyed``); the rows left to explain, the misses counted, and per run the rows to rebuild from every
        process's figures."""
        pending: list[Pending] = []
        counts: Counter[str] = Counter()
        rebuild: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
        inserts, deletes, unexplain = [], [], []
        updates: list[tuple[dict[str, Any], bool]] = []
        filled: dict[str, list[dict[str, Any]]] = {"parts": [], "program": []}  # texts a row gains
        texts = _Texts(changes)
        moved = {pid for pid, c in changes.items() if c.before is None or any(
            c.before.run[n] != v for n, v in _run_inputs(c.record).items())}
        for ident in idents:
            run_id, key, job, kind = ident
            row = rows.get(ident)
            found = work.change(ident, row)
            if found is None:
                rebuild[run_id].add((key, job, kind))
                continue
            less, more = found
            before: tuple | None = None
            if row is None:
                assert more is not None
                row = {"cache": self.cache, "run_id": run_id, "key": key, "job": job, "kind": kind, **more,
                       "counted": 0, "parts": None, "program": None, "cause": None, "differs": None, "nearest": None,
                       "fix": None}
                keyed.gain(key, kind, 0, 0.0, row)
                texts.fill(row)
                inserts.append(row)
            else:
                before, hits, saved = _inputs(row), row["hits"], row["saved_s"]
                was_indexed = tuple(row[n] for n in _INDEXED)
                if less is not None:
                    groups.take(row, less)
                if more is not None:
                    groups.merge(row, more)
                if row["processes"] <= 0:
                    deletes.append(_ident(self.cache, run_id, key, job, kind))
                    keyed.regather.add(key)
                    continue
                keyed.gain(key, kind, hits, saved, row)
                updates.append((row, was_indexed != tuple(row[n] for n in _INDEXED)))
                missing = [column for column in filled if row[column] is None]
                if missing:
                    texts.fill(row)
                    for column in missing:
                        if row[column] is not None:
                            filled[column].append({**_ident(self.cache, run_id, key, job, kind),
                                                   "b_text": row[column]})
            if f.is_miss(kind, row["event"]):
                if (row["cause"] is not None and before == _inputs(row)
                        and (run_id, row["process_index"]) not in moved):
                    if row["missed"] > row["counted"]:
                        counts[row["cause"]] += row["missed"] - row["counted"]
                        row["counted"] = row["missed"]
                else:
                    if row["cause"] is not None:
                        unexplain.append(row)
                    row["cause"] = None
                    pending.append(Pending(run_id, job, key))
            elif row["cause"] is not None:
                unexplain.append(row)
                row["cause"] = None
        rawsql.execute_many(self.conn, "ingest-usage-delete", _usage_delete, deletes)
        usage = table_of(UsageRow)
        for reindex in (False, True):
            rawsql.update_rows(self.conn, usage, _KEY, [n for n in _UPDATED if reindex or n not in _INDEXED],
                               [{"cache": self.cache, **r} for r, moved in updates if moved == reindex])
        for column, params in filled.items():
            rawsql.execute_many(self.conn, ("ingest-usage-text", column), functools.partial(_text_update, column),
                                params)
        rawsql.execute_many(self.conn, "ingest-unexplain", _unexplain, [
            _ident(self.cache, r["run_id"], r["key"], r["job"], r["kind"]) for r in unexplain])
        rawsql.insert_rows(self.conn, usage, inserts)
        return pending, counts, rebuild

    # --- processes --------------------------------------------------------------------------------------------

    def _store_processes(self, changes: dict[tuple[str, int], Change]) -> None:
        """Write each changed process's run row (with its own totals) and figures."""
        runs, figures = [], []
        now = time.time()
        for (run_id, index), c in sorted(changes.items()):
            fig = c.figures
            runs.append({"cache": self.cache, "run_id": run_id, "process_index": index,
                         **_run_fields(c.record, len(fig.keys), self.source, now), "hits": sum(fig.hits),
                         "compiles": sum(fig.compiles), "writes": sum(fig.writes), "saved_s": sum(fig.saved_s)})
            figures.append({"cache": self.cache, "run_id": run_id, "process_index": index,
                            "figures": f.encode(fig)})
        rawsql.upsert_many(self.conn, table_of(RunRow), runs)
        rawsql.upsert_many(self.conn, table_of(ProcessKeysRow), figures)

    # --- aggregates -------------------------------------------------------------------------------------------

    def _store_stats(self, keys: list[str], stats: dict[str, dict], writers: dict[str, Writer], full: set[str],
                     keyed: _Keyed) -> None:
        """Update the keys' aggregates: as differences, or gathered again from their usage rows (and weighed again
        where their first writer changed)."""
        changed: dict[str, dict[str, Any]] = {}
        for key in keys:
            ks = stats.get(key)
            if ks is None or key in full or key in keyed.regather:
                continue
            hits, saved = keyed.deltas.get(key, (0, 0.0))
            last = keyed.last_hit.get(key)
            new = {**ks, "hits": ks["hits"] + hits, "saved_s": ks["saved_s"] + saved}
            if last is not None and (ks["last_hit_s"] is None or last > ks["last_hit_s"]):
                new["last_hit_s"] = last
            if key in writers:
                new.update(writers[key].fields)
            if new != ks:
                changed[key] = new
        again = (set(keys) - set(stats)) | keyed.regather
        changed.update(aggregates.gather(self.s, self.cache, again - full))
        changed.update(aggregates.gather(self.s, self.cache, full, reweigh=True))
        aggregates.store(self.s, self.cache, changed)


class _Keyed:
    """What a batch's usage rows add to their keys' aggregates (jobs' hits, seconds saved, the latest hit), and the
    keys to gather again from their rows instead (a row rebuilt or gone: its key's last hit may move back)."""

    def __init__(self) -> None:
        self.deltas: dict[str, tuple[int, float]] = {}
        self.last_hit: dict[str, float] = {}
        self.regather: set[str] = set()

    def gain(self, key: str, kind: str, hits: int, saved: float, row: dict[str, Any]) -> None:
        """``row`` of ``key`` had ``hits`` and ``saved`` seconds before the batch changed it."""
        d_hits = f.used_hits(kind, row["hits"] - hits)
        d_saved = row["saved_s"] - saved
        if d_hits or d_saved:
            was = self.deltas.get(key, (0, 0.0))
            self.deltas[key] = (was[0] + d_hits, was[1] + d_saved)
        last = row["last_hit_s"]
        if last is not None and (key not in self.last_hit or last > self.last_hit[key]):
            self.last_hit[key] = last


def _pk(table) -> list:
    """A usage row's key, bound as :func:`_ident`'s parameters."""
    return [table.c.cache == bindparam("b_cache"), table.c.run_id == bindparam("b_run_id"),
            table.c.key == bindparam("b_key"), table.c.job == bindparam("b_job"), table.c.kind == bindparam("b_kind")]


def _ident(cache: str, run_id: str, key: str, job: str, kind: str) -> dict[str, str]:
    return {"b_cache": cache, "b_run_id": run_id, "b_key": key, "b_job": job, "b_kind": kind}


#: What a usage row's update writes: its processes' figures and how many misses were counted.
_UPDATED = (*groups.COLUMNS, "counted")
#: What ingestion reads of a usage row: its key, what it updates, and whether it has an explanation, parts and a
#: program (their texts stay in the catalog: a storm's batches read and write the same rows again and again).
_READ = ("run_id", "key", "job", "kind", *_UPDATED, "cause", "parts", "program")


#: A usage row's columns that its indexes hold besides its key: an update that leaves them out leaves the indexes
#: alone (SQLite rewrites an index entry whenever its column is assigned, even to the value it had; PostgreSQL can
#: then keep the row's new version on its page, unseen by the indexes).
_INDEXED = ("first_at", "function")
_KEY = ("cache", "run_id", "key", "job", "kind")


def _processes_statement(within: rawsql.Within) -> Select:
    return select(RunRow.process_index, *_RUN_COLUMNS).where(
        RunRow.cache == bindparam("cache"), RunRow.run_id == bindparam("run_id"),
        within(table_of(RunRow).c.process_index))


def _figures_statement(within: rawsql.Within) -> Select:
    return select(ProcessKeysRow.process_index, ProcessKeysRow.figures).where(
        ProcessKeysRow.cache == bindparam("cache"), ProcessKeysRow.run_id == bindparam("run_id"),
        within(table_of(ProcessKeysRow).c.process_index))


def _usage_statement(within: rawsql.Within) -> Select:
    u = table_of(UsageRow)
    # The explanation's cause and whether parts and a program are there: the texts themselves are not read.
    flags = [case((u.c[n].is_(None), None), else_=literal(n)).label(n) for n in ("parts", "program")]
    return (select(*(u.c[n] for n in _READ[:-2]), *flags)
            .where(u.c.cache == bindparam("cache"), u.c.run_id == bindparam("run_id"), within(u.c.key)))


def _text_update(column: str) -> Update:
    t = table_of(UsageRow)
    return update(t).where(*_pk(t)).values({column: bindparam("b_text")})


def _watermark_statement() -> Select:
    return select(CacheRow.compacted_before_s).where(CacheRow.name == bindparam("cache"))


def _unexplain() -> Update:
    t = table_of(UsageRow)
    return update(t).where(*_pk(t)).values(cause=None, differs=None, nearest=None, fix=None)


def _usage_delete() -> Delete:
    t = table_of(UsageRow)
    return delete(t).where(*_pk(t))


def _inputs(row: dict[str, Any]) -> tuple:
    """What a row's explanation was made of, on the row (explain.INPUTS; of its parts and program, whether it has
    them: they never change once there)."""
    return tuple(row[n] is not None if n in ("parts", "program") else row[n] for n in explaining.INPUTS)


def _run_inputs(record: RunRecord) -> dict[str, Any]:
    """What an explanation reads of a row's representative run, besides the row (explain.RUN_INPUTS)."""
    return {"fingerprint_digest": record.fingerprint.digest, "topology": record.topology,
            "started_s": record.started_at}


def _run_fields(record: RunRecord, keys: int, source: str, now: float) -> dict[str, Any]:
    fp = record.fingerprint
    return {
        "job": record.job, "process_count": record.process_count, "host": record.host,
        "topology": record.topology, "cache_dir": record.cache_dir, "jax": fp.jax, "jaxlib": fp.jaxlib,
        "backend": fp.backend, "fingerprint": msgspec.json.encode(fp).decode(), "fingerprint_digest": fp.digest,
        "started_s": record.started_at, "updated_s": record.updated_at, "final": record.final, "pid": record.pid,
        "keys": keys, "source": source, "ingested_s": now, "kind": record.kind,
    }


class _Texts:
    """Each key's parts and program as the JSON text the catalog stores, from the batch's reports (the first that
    carries them), encoded only for a row that lacks them."""

    def __init__(self, changes: dict[tuple[str, int], Change]) -> None:
        self._reports = [c.report for c in changes.values()]
        self._found: dict[str, KeyUsage] | None = None

    def fill(self, row: dict[str, Any]) -> None:
        if self._found is None:
            self._found = {}
            for report in self._reports:
                for usage in report.usages:
                    if usage.parts is not None or usage.program is not None:
                        self._found.setdefault(usage.key, usage)
        found = self._found.get(row["key"])
        if found is None:
            return
        if row["parts"] is None and found.parts is not None:
            row["parts"] = _json.encode(found.parts).decode()
        if row["program"] is None and found.program is not None:
            row["program"] = _json.encode(found.program).decode()
