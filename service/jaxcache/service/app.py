"""The FastAPI application: the shared state, the ASGI layers, the API's routers, the dashboard, background loops."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from jaxcache.service import dashboard
from jaxcache.service.api import caches, docs, entries, errors, integrity, jobs, ops, prune, reports, warmups
from jaxcache.service.middleware import LimitsAndMetrics
from jaxcache.service.pagecache import ServeCachedPages
from jaxcache.service.settings import ServiceSettings
from jaxcache.service.state import State
from jaxcache.service.tasks import memory
from jaxcache.service.tasks.loops import background
from jaxcache.service.workers import Runtime

#: In the order requests are matched against them (each route tried in turn): the busiest first. At the end, after
#: every other router and the dashboard, a report's POST took 0.24 ms to find its route.
ROUTERS = (reports, ops, entries, caches, prune, jobs, warmups, integrity)


def create_app(settings: ServiceSettings | None = None, *, runtime: Runtime | None = None) -> FastAPI:
    """Build the service (one of ``jaxcache serve --workers``'s given their ``runtime``). Raises
    :class:`JaxcacheError` for unusable settings (bad URL, missing root)."""
    settings = settings or ServiceSettings()
    # A worker's serving process migrated the catalog before it started any (and alembic, imported to migrate,
    # would cost each worker 10 MiB).
    state = State(settings, runtime.generations(settings) if runtime is not None else None, migrate=runtime is None)
    state.runtime = runtime

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.role == "api":  # another process (--role loops) runs them
            loops: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()
        else:  # one process runs them: this one, or the workers' leader
            loops = background(state) if runtime is None else runtime.loops_when_leader(state)
        try:
            async with loops:
                memory.settle_startup()
                yield
        finally:
            state.catalog.dispose()  # what was accepted waits in the inbox for the next drain

    app = FastAPI(
        title="jaxcache",
        version="1",
        summary="Catalog, statistics and policy-driven pruning of JAX persistent compilation caches.",
        lifespan=lifespan,
        docs_url=None, redoc_url=None,  # served from the package by api/docs.py, not from a CDN
    )
    app.state.jaxcache = state
    # Inside LimitsAndMetrics, which times the pages it answers too.
    app.add_middleware(ServeCachedPages, pages=state.pages, auth=state.auth)
    app.add_middleware(LimitsAndMetrics, metrics=state.metrics, max_body_bytes=state.settings.max_body_bytes,
                       max_report_bytes=state.settings.max_report_bytes)
    errors.install(app)
    for module in ROUTERS:
        app.include_router(module.router)
    docs.install(app)
    dashboard.install(app, state)  # the web dashboard at / (the API's docs stay at /docs)
    reports.document_record_schema(app)
    return app
