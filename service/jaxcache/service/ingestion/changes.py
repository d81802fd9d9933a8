"""What a batch of run records changes, worked out before anything is written: per usage row, each process's old
part and new one; per key, its first writer once the batch is in, and whether hits stored before must be weighed
again (docs/service.md, "Run records")."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

import numpy as np

from jaxcache import records
from jaxcache.records import RunRecord
from jaxcache.service.ingestion import aggregates, groups
from jaxcache.service.ingestion import figures as f
from jaxcache.service.ingestion.packed import Report


class Stored(NamedTuple):
    """A process as the catalog holds it: its run row's columns (``batch.RUN``) and its figures."""

    run: dict[str, Any]
    figures: f.Figures


class Change(NamedTuple):
    """A process whose record a batch replaces: as stored (None: new) and its latest record in the batch (its
    header, and its figures)."""

    before: Stored | None
    record: RunRecord
    figures: f.Figures
    report: Report


class Writer(NamedTuple):
    """A key's first writer once the batch is in: its compile seconds and its aggregate fields."""

    compile_s: float | None
    fields: dict[str, Any]


def first_writers(changes: dict[tuple[str, int], Change], stats: dict[str, dict]
                  ) -> tuple[dict[str, Writer], dict[str, float | None], set[str]]:
    """The first writer, once the batch is in, of each key the batch writes; the compile seconds of every touched
    key's first writer; and the keys to gather again with their seconds saved weighed again: a stored first writer
    that no longer wrote as it did, or a new writer whose measure differs from the one before for a key already
    hit."""
    found: dict[str, list[tuple[tuple, dict[str, Any]]]] = defaultdict(list)
    for (run_id, index), c in changes.items():
        r, fig, fp = c.record, c.figures, c.record.fingerprint
        for i in [i for i, (e, w) in enumerate(zip(fig.events, fig.writes, strict=True)) if w or e == records.WRITE]:
            at = fig.first_at[i] or r.started_at
            found[fig.keys[i]].append(((at, run_id, index), {
                "writer_job": r.job, "writer_run": run_id, "writer_process": index, "writer_host": r.host,
                "writer_topology": r.topology, "writer_jax": fp.jax, "writer_jaxlib": fp.jaxlib, "writer_at_s": at,
                "writer_compile_s": fig.compile_s[i]}))
    full: set[str] = set()
    for key, held in stats.items():
        pid = (held["writer_run"], held["writer_process"])
        if pid in changes and _write_of(changes[pid], key) != _write_of(changes[pid], key, before=True):
            full.add(key)  # the first writer's own write moved: another may be first now
    writers: dict[str, Writer] = {}
    for key, candidates in found.items():
        ks = stats.get(key)
        if key in full:
            continue
        if ks is not None and ks["writer_run"] is not None:
            candidates.append((aggregates.order(ks), {n: ks[n] for n in aggregates.WRITER}))
        fields = min(candidates, key=lambda c: c[0])[1]
        writers[key] = Writer(fields["writer_compile_s"], fields)
        before = ks["writer_compile_s"] if ks is not None and ks["writer_run"] is not None else None
        if ks is not None and fields["writer_compile_s"] != before and ks["hits"]:
            full.add(key)  # hits stored before were weighed by another measure
    measure = {k: ks["writer_compile_s"] for k, ks in stats.items()}
    measure.update((k, w.compile_s) for k, w in writers.items())
    return writers, measure, full


def _write_of(c: Change, key: str, *, before: bool = False) -> tuple[float, float | None] | None:
    """When one changed process's figures (``before``: as stored) wrote ``key``, and the compile seconds they
    measured; None: they did not."""
    if before and c.before is None:
        return None
    fig, started = (c.before.figures, c.before.run["started_s"]) if before and c.before else (c.figures,
                                                                                                c.record.started_at)
    try:
        i = fig.keys.index(key)
    except ValueError:
        return None
    if not f.wrote(fig.events[i], fig.writes[i]):
        return None
    return fig.first_at[i] or started, fig.compile_s[i]


def weigh(c: Change, measure: dict[str, float | None]) -> None:
    """Set the seconds saved of a process's new figures by its keys' first writers' measure."""
    fig = c.figures
    if c.record.kind != records.JOB:
        return  # a warm-up's hits are not use: they save nothing
    # f.saved_of for every key at once (a storm weighs hundreds of thousands).
    hits = np.array(fig.hits, dtype=np.float64)
    ours = hits * np.array([measure.get(k) for k in fig.keys], dtype=np.float64) - np.array(fig.retrieval_s)
    jax = np.maximum(np.array(fig.jax_saved_s, dtype=np.float64), 0.0)
    fig.saved_s = np.where(hits == 0, 0.0, np.where(ours > 0, ours, jax)).tolist()  # no measure (NaN): JAX's


class Parts:
    """The batch's changes by usage row: for each (run id, job, kind) and key, the changed processes' old parts
    (``removed``, by process) and new ones (``added``)."""

    def __init__(self, changes: dict[tuple[str, int], Change]) -> None:
        self.removed: dict[tuple[str, str, str], dict[str, dict[int, groups.Part]]] = {}
        self.added: dict[tuple[str, str, str], dict[str, list[groups.Part]]] = {}
        for (run_id, index), c in changes.items():
            if c.before is not None:
                run = c.before.run
                gone = self.removed.setdefault((run_id, run["job"], run["kind"]), defaultdict(dict))
                updated, started = run["updated_s"], run["started_s"]
                for key, fig in zip(c.before.figures.keys, c.before.figures.rows(), strict=True):
                    gone[key][index] = (fig, index, updated, started)
            r = c.record
            new = self.added.setdefault((run_id, r.job, r.kind), defaultdict(list))
            updated, started = r.updated_at, r.started_at
            for key, fig in zip(c.figures.keys, c.figures.rows(), strict=True):
                new[key].append((fig, index, updated, started))

    def idents(self) -> list[tuple[str, str, str, str]]:
        """Every usage row touched, as (run id, key, job, kind), in order."""
        return sorted({(run, key, job, kind) for side in (self.removed, self.added)
                       for (run, job, kind), by_key in side.items() for key in by_key})
