"""Caches: the configured roots and their statistics."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter, Request, Response

from jaxcache.service.caches import summary
from jaxcache.service.caches.schemas import CacheList, StatsModel
from jaxcache.service.catalog.database import Generation
from jaxcache.service.state import State
from jaxcache.service.web import conditional
from jaxcache.service.web.deps import ERRORS, CacheName, ReadAuth, state_of, storage_of

router = APIRouter(tags=["caches"], responses=ERRORS)


@router.get("/v1/caches", response_model=CacheList, operation_id="listCaches")
def list_caches(request: Request, _p: ReadAuth) -> CacheList:
    """Every configured cache with its size and last scan."""
    return CacheList(caches=summary.caches(state_of(request)))


@router.get("/v1/caches/{cache}/stats", response_model=StatsModel, operation_id="getStats",
            responses={304: {"description": "the statistics have not changed since the `ETag` in `If-None-Match`"}})
async def get_stats(request: Request, cache: CacheName, _p: ReadAuth) -> Response:
    """Totals by function and compression, growth per day, corrupt entries, orphans, and 24 h and 7 d hit rates."""
    storage_of(request, cache)
    state = state_of(request)
    generation = await state.generations.current(cache)  # a 304 takes no thread of its own
    tag = conditional.etag(generation, clock=True)
    if conditional.matches(request, tag):
        return conditional.not_modified(tag)
    body = await anyio.to_thread.run_sync(_body, state, cache, generation)
    return Response(body, media_type="application/json", headers=conditional.headers(tag))


def _body(state: State, cache: str, generation: Generation) -> bytes:
    return StatsModel(**summary.stats_of(state, cache, generation)).model_dump_json().encode()
