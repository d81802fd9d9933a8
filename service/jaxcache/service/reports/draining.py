"""The drain's rounds: what waits in the report inbox, folded into the catalog, with the metrics it moves."""

from __future__ import annotations

from collections.abc import Mapping

from jaxcache.service.catalog.generations import USAGE
from jaxcache.service.reports.drain import caches_waiting, drain
from jaxcache.service.state import State


def drain_all(state: State) -> int:
    """Fold what waits in the report inbox, of every cache; the records that changed the catalog."""
    fresh = 0
    for name in caches_waiting(state.catalog):
        state.loops.on_cache(name)
        # Every cache's, configured here or not (another replica's, or one dropped from the settings): rows nobody
        # drains would fill the inbox and refuse every report.
        storage = state.storages.get(name)
        drained = drain(state.catalog, name, root=storage.url if storage is not None else None)
        note_folded(state, name, drained.fresh, sum(drained.misses.values()), drained.malformed,
                    configured=storage is not None)
        fresh += sum(drained.fresh.values())
    return fresh


def note_folded(state: State, name: str, fresh: Mapping[str, int], misses: int, dropped: Mapping[str, int], *,
                configured: bool = True) -> None:
    """What a drain (the loop's, or a rescan's own) did with ``name``'s records: those that changed the catalog and
    those it dropped, by source, counted once, in whichever drain took them; and, for a cache this process serves,
    its usage figures' change count moved."""
    for source, n in fresh.items():
        state.metrics.reports_ingested.labels(name, source).inc(n)
    for source, n in dropped.items():
        state.metrics.reports_malformed.labels(source).inc(n)
    if configured and (fresh or misses):
        state.generations.bump(name, USAGE)  # hits, last use, first writers and misses moved
