"""A run's usage row of one key, from the figures of the run's processes (:mod:`.figures`): built from all of them,
or changed in place when processes' new figures replace their old ones.

Counts and seconds are sums, so a process's old figures come off exactly. The other columns are extremes (first and
last use, the last hit, the most informative event, the earliest write, the lowest process index): a process's new
figures that are at least as extreme as its old ones (a record's totals only grow) keep them right; otherwise
:func:`covered` says so and the caller rebuilds the row from every process's figures. :func:`build` makes what
some processes' parts count for, :func:`merge` and :func:`take` count it in a row or take it out; a storm's batches
make it a column at a time instead (:mod:`.stacked`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from jaxcache.records import HIT, JOB, WRITE
from jaxcache.service.ingestion import figures as f

#: One process's part of a row: its figures of the key (a :meth:`figures.Figures.rows` tuple), its index, and its
#: run row's updated_s and started_s. A plain tuple, indexed by these: a storm makes hundreds of thousands.
Part = tuple[tuple[Any, ...], int, float, float]
FIG: Final = 0
PROCESS: Final = 1
UPDATED: Final = 2
STARTED: Final = 3

#: A usage row's columns that its processes' figures make (the rest: its key, parts and program, explanation).
COLUMNS = ("process_index", "processes", "function", "event", "hits", "compiles", "writes", "reason", "compile_s",
           "retrieval_s", "jax_saved_s", "saved_s", "size_bytes", "first_at", "last_at", "last_hit_s", "updated_s",
           "writer_process", "writer_at_s", "writer_compile_s", "missed")
EVENT_OF_RANK = {rank: event for event, rank in f.RANK.items()}
#: The columns that are sums over the row's processes; the rest are extremes.
SUMS = ("processes", "hits", "compiles", "writes", "compile_s", "retrieval_s", "jax_saved_s", "saved_s", "missed")
_EXTREMES = [n for n in COLUMNS if n not in SUMS]


def _hit(kind: str, fig: tuple[Any, ...]) -> float | None:
    return f.hit_at(f.used_hits(kind, fig[f.HITS]), fig[f.FIRST_AT], fig[f.LAST_AT])


def _write(part: Part) -> tuple[float, int] | None:
    """When ``part`` wrote its key (first use, else its process's start) and its process; None: it did not."""
    fig = part[FIG]
    if not f.wrote(fig[f.EVENT], fig[f.WRITES]):
        return None
    return fig[f.FIRST_AT] or part[STARTED], part[PROCESS]


def build(kind: str, parts: Sequence[Part]) -> dict[str, Any] | None:
    """The row's COLUMNS from every process's part (None: no process has one)."""
    if not parts:
        return None
    (keys, functions, events, hits, compiles, writes, reasons, compile_s, retrieval_s, jax_saved_s, saved_s, sizes,
     first_at, last_at) = zip(*(p[FIG] for p in parts), strict=True)
    hit = None
    if kind == JOB:
        hit = max((t or first_use for h, first_use, t in zip(hits, first_at, last_at, strict=True)
                   if h and (t or first_use)), default=None)
    row: dict[str, Any] = {
        "processes": len(parts), "hits": sum(hits), "compiles": sum(compiles), "writes": sum(writes),
        "compile_s": sum((c for c in compile_s if c), 0.0), "retrieval_s": sum(retrieval_s, 0.0),
        "jax_saved_s": sum(jax_saved_s, 0.0), "saved_s": sum(saved_s, 0.0),
        "missed": len(events) - events.count(HIT) if kind == JOB else 0,
        "process_index": min(p[PROCESS] for p in parts), "function": min(functions),
        "event": EVENT_OF_RANK[max(f.RANK[e] for e in set(events))],
        "reason": max((r for r in reasons if r is not None), default=None),
        "size_bytes": max((s for s in sizes if s is not None), default=None),
        "first_at": min((t for t in first_at if t), default=0.0), "last_at": max(last_at), "last_hit_s": hit,
        "updated_s": max(p[UPDATED] for p in parts), "writer_process": None, "writer_at_s": None,
        "writer_compile_s": None}
    written = [(fig[f.FIRST_AT] or p[STARTED], p[PROCESS], fig[f.COMPILE_S]) for p in parts
               if (fig := p[FIG])[f.WRITES] or fig[f.EVENT] == WRITE]
    if written:
        at, process, measured = min(written, key=lambda w: (w[0], w[1]))
        row.update(writer_at_s=at, writer_process=process, writer_compile_s=measured)
    return row


def merge(row: dict[str, Any], more: dict[str, Any]) -> None:
    """Count in ``row`` what :func:`build` made of other processes' parts (``more``)."""
    empty = row["processes"] == 0
    for n in SUMS:
        row[n] += more[n]
    if empty:
        row.update((n, more[n]) for n in _EXTREMES)
        return
    row["process_index"] = min(row["process_index"], more["process_index"])
    row["function"] = min(row["function"], more["function"])
    if f.RANK[more["event"]] > f.RANK[row["event"]]:
        row["event"] = more["event"]
    reason, size, first, hit = more["reason"], more["size_bytes"], more["first_at"], more["last_hit_s"]
    if reason is not None and (row["reason"] is None or reason > row["reason"]):
        row["reason"] = reason
    if size is not None and (row["size_bytes"] is None or size > row["size_bytes"]):
        row["size_bytes"] = size
    if first and (not row["first_at"] or first < row["first_at"]):
        row["first_at"] = first
    row["last_at"] = max(row["last_at"], more["last_at"])
    if hit is not None and (row["last_hit_s"] is None or hit > row["last_hit_s"]):
        row["last_hit_s"] = hit
    row["updated_s"] = max(row["updated_s"], more["updated_s"])
    at, process = more["writer_at_s"], more["writer_process"]
    if at is not None and (row["writer_at_s"] is None or (at, process) < (row["writer_at_s"], row["writer_process"])):
        row.update(writer_at_s=at, writer_process=process, writer_compile_s=more["writer_compile_s"])


def take(row: dict[str, Any], less: dict[str, Any]) -> None:
    """Take out of ``row`` the counts and seconds of what :func:`build` made of some of its processes' parts (its
    extremes: see :func:`covered`)."""
    for n in SUMS:
        row[n] -= less[n]


def covered(row: dict[str, Any], kind: str, old: Part, new: Part | None) -> bool:
    """Whether ``row``'s extremes stay right when ``old`` (a process's part in it) is replaced by ``new`` (the same
    process's, or None): each extreme ``old`` holds, ``new`` holds as well or better."""
    o = old[FIG]
    if new is None:
        return not (old[PROCESS] == row["process_index"] or o[_FUNCTION] == row["function"]
                    or _RANK[o[_EVENT]] == _RANK[row["event"]]
                    or (o[_REASON] is not None and o[_REASON] == row["reason"])
                    or (o[_SIZE] is not None and o[_SIZE] == row["size_bytes"])
                    or (o[_FIRST] and o[_FIRST] == row["first_at"])
                    or (o[_LAST] and o[_LAST] == row["last_at"])
                    or (row["last_hit_s"] is not None and _hit(kind, o) == row["last_hit_s"])
                    or old[UPDATED] == row["updated_s"]
                    or (row["writer_at_s"] is not None and _write(old) == (row["writer_at_s"], row["writer_process"])))
    n = new[FIG]
    if (n[_FIRST] == o[_FIRST] and n[_LAST] >= o[_LAST] and n[_HITS] >= o[_HITS] and _same_rest(o, n)
            and new[UPDATED] >= old[UPDATED] and new[STARTED] == old[STARTED]
            and (not o[_HITS] or (n[_LAST] or n[_FIRST]) >= (o[_LAST] or o[_FIRST]))):
        return True  # the usual rewrite of a record: the same use of the key, later and with more hits
    if o[_FUNCTION] == row["function"] and n[_FUNCTION] > o[_FUNCTION]:
        return False
    if _RANK[o[_EVENT]] == _RANK[row["event"]] and _RANK[n[_EVENT]] < _RANK[o[_EVENT]]:
        return False
    if o[_REASON] is not None and o[_REASON] == row["reason"] and (n[_REASON] is None or n[_REASON] < o[_REASON]):
        return False
    if o[_SIZE] is not None and o[_SIZE] == row["size_bytes"] and (n[_SIZE] is None or n[_SIZE] < o[_SIZE]):
        return False
    if o[_FIRST] and o[_FIRST] == row["first_at"] and (not n[_FIRST] or n[_FIRST] > o[_FIRST]):
        return False
    if o[_LAST] and o[_LAST] == row["last_at"] and n[_LAST] < o[_LAST]:
        return False
    old_hit = _hit(kind, o)
    if old_hit is not None and old_hit == row["last_hit_s"]:
        new_hit = _hit(kind, n)
        if new_hit is None or new_hit < old_hit:
            return False
    if old[UPDATED] == row["updated_s"] and new[UPDATED] < old[UPDATED]:
        return False
    old_write = _write(old)
    if old_write is not None and old_write == (row["writer_at_s"], row["writer_process"]):
        return _write(new) == old_write and n[_COMPILE_S] == o[_COMPILE_S]
    return True


_FUNCTION, _EVENT, _HITS, _WRITES, _REASON, _COMPILE_S, _SIZE, _FIRST, _LAST = (
    f.FUNCTION, f.EVENT, f.HITS, f.WRITES, f.REASON, f.COMPILE_S, f.SIZE_BYTES, f.FIRST_AT, f.LAST_AT)
_RANK = f.RANK


def _same_rest(o: tuple[Any, ...], n: tuple[Any, ...]) -> bool:
    """Whether two parts of one process agree on all that an extreme of theirs depends on but time and hits."""
    return (o[_FUNCTION] == n[_FUNCTION] and o[_EVENT] == n[_EVENT] and o[_REASON] == n[_REASON]
            and o[_SIZE] == n[_SIZE] and o[_WRITES] == n[_WRITES] and o[_COMPILE_S] == n[_COMPILE_S])
