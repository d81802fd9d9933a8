"""The FastAPI application: the shared state, the ASGI layers, the API's routers, the dashboard, background loops, and
what each feature is handed of the others (a rescan, integrity passes): no feature imports another."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from functools import partial

import anyio
from fastapi import FastAPI

from jaxcache.service import dashboard, memory, ops, rounds
from jaxcache.service.background import background
from jaxcache.service.caches import route as caches
from jaxcache.service.caches import summary
from jaxcache.service.entries import route as entries
from jaxcache.service.integrity import route as integrity
from jaxcache.service.integrity import verification
from jaxcache.service.prune import route as prune
from jaxcache.service.prune.run import Handed
from jaxcache.service.reports.ingest import route as reports
from jaxcache.service.reports.ingest.queue import drain_all
from jaxcache.service.reports.jobs import queries as runs
from jaxcache.service.reports.jobs import route as jobs
from jaxcache.service.reports.jobs.gauges import UsageCollector
from jaxcache.service.reports.records import root_change
from jaxcache.service.rescan import route as rescan
from jaxcache.service.settings import ServiceSettings
from jaxcache.service.state import State
from jaxcache.service.warmups import route as warmups
from jaxcache.service.web import docs, errors
from jaxcache.service.web.middleware import LimitsAndMetrics


def create_app(settings: ServiceSettings | None = None, *, prepared: bool = False) -> FastAPI:
    """Build the service (``prepared``: a worker, whose parent migrated the catalog and registered the caches). Raises
    :class:`JaxcacheError` for unusable settings (bad URL, missing root)."""
    settings = settings or ServiceSettings()
    state = State(settings, prepared=prepared)
    if not prepared:
        state.root_changes = root_change.register(
            state.catalog, {name: storage.url for name, storage in state.storages.items()}, settings.root_changed)
    state.open()
    usage = UsageCollector(state.catalog, list(settings.caches))
    state.metrics.register(usage)
    if settings.role != "api":  # the catalog's gauges from the start, where the loops keep them fresh
        for name in settings.caches:
            summary.refresh_totals(state.metrics, state.catalog, name)
            verification.refresh_gauges(state.metrics, state.catalog, name)

    scanned = partial(rounds.ensure_scanned, state)
    rounds_done: set[str] = set()  # caches this process has rescanned in a background round

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.reach.look_all()  # in the background: readiness and pages say what it finds
        if settings.role == "api":  # another process (--role loops) runs them
            loops: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()
        else:  # each of its passes claimed by a lock: see background.py
            loops = background(state.loops, drain=partial(drain_all, state),
                               rescan=partial(rounds.rescan_all, state, rounds_done),
                               verify=partial(verification.verify_all, state, ensure_scanned=scanned))
        try:
            async with loops, anyio.create_task_group() as tasks:
                await tasks.start(usage.refreshing, settings.usage_metrics_s)  # read once before serving
                memory.settle_startup()
                yield
                tasks.cancel_scope.cancel()
        finally:
            state.catalog.dispose()  # what was accepted waits in the inbox for the next drain

    app = FastAPI(title="jaxcache", version="1", lifespan=lifespan,
                  summary="Catalog, statistics and policy-driven pruning of JAX persistent compilation caches.",
                  docs_url=None, redoc_url=None)  # served from the package by web/docs.py, not from a CDN
    app.state.jaxcache = state
    app.add_middleware(LimitsAndMetrics, metrics=state.metrics, max_body_bytes=state.settings.max_body_bytes,
                       max_report_bytes=state.settings.max_report_bytes)
    errors.install(app)
    pruning = _pruning(state)
    # In the order requests are matched against them: the busiest first, so a report's POST finds its route soonest.
    for router in (reports.router, ops.router, entries.router, caches.router,
                   rescan.routes(partial(rounds.rescan_cache, state)), prune.routes(pruning), jobs.router,
                   warmups.router, integrity.routes(scanned)):
        app.include_router(router)
    docs.install(app)
    dashboard.install(app, state, pruning)  # the web dashboard at / (the API's docs stay at /docs)
    reports.document_record_schema(app)
    return app


def _pruning(state: State) -> Handed:
    """What prunes run of other features: the round's rescan, integrity passes, the runs' jaxlibs, the summary."""
    settings = state.settings

    def verify(name: str, min_age_s: float) -> object:  # throttled as the background pass is
        return verification.run_pass(state.catalog, name, state.storages[name], min_age_s=min_age_s,
                                     bytes_per_s=settings.verify_bytes_per_s, cpu_share=settings.verify_cpu_share,
                                     trusted=settings.trusted)

    def recent_jaxlibs(name: str, since: float) -> set[str]:
        with state.catalog.reader() as conn:
            return runs.recent_jaxlibs(conn, name, since=since)

    return Handed(rescan=partial(rounds.rescan_cache, state), verify=verify,
                  unjudged=lambda name: verification.unjudged(state.catalog, name, settings.trusted),
                  recent_jaxlibs=recent_jaxlibs, changed=partial(summary.changed, state),
                  keep=partial(summary.keep, state))
