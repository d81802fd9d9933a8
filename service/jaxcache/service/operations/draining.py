"""The drain's rounds: what waits in the report inbox, folded into the catalog, with the metrics it moves."""

from __future__ import annotations

from jaxcache.service.catalog.generations import USAGE
from jaxcache.service.ingestion import inbox
from jaxcache.service.ingestion.drain import caches_waiting, drain
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
        for source, n in drained.fresh.items():
            state.metrics.reports_ingested.labels(name, source).inc(n)
        if drained.malformed:
            state.metrics.reports_malformed.labels(inbox.REPORT).inc(drained.malformed)
        if storage is not None and (drained.fresh or drained.misses):
            state.generations.bump(name, USAGE)  # hits, last use, first writers and misses moved
        fresh += sum(drained.fresh.values())
    return fresh
