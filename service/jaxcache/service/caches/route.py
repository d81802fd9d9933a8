"""Caches: the configured roots, their statistics, and rescans on demand."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request, Response

from jaxcache.service.caches.schemas import CacheList, CacheSummary, RescanModel, StatsModel
from jaxcache.service.rescan import rescans
from jaxcache.service.web import conditional
from jaxcache.service.web.common import ErrorModel
from jaxcache.service.web.deps import ERRORS, AdminAuth, CacheName, ReadAuth, state_of, storage_of

router = APIRouter(tags=["caches"], responses=ERRORS)

#: How long POST /v1/caches/{cache}/rescan waits for a rescan another replica is running before it answers 409.
RESCAN_WAIT_S = 60.0


@router.get("/v1/caches", response_model=CacheList, operation_id="listCaches")
def list_caches(request: Request, _p: ReadAuth) -> CacheList:
    """Every configured cache with its size and last scan."""
    return CacheList(caches=[CacheSummary(**asdict(c)) for c in state_of(request).caches()])


@router.get("/v1/caches/{cache}/stats", response_model=StatsModel, operation_id="getStats",
            responses={304: {"description": "the statistics have not changed since the `ETag` in `If-None-Match`"}})
def get_stats(request: Request, cache: CacheName, _p: ReadAuth) -> Response:
    """Totals by function and compression, growth per day, corrupt entries, orphans, and 24 h and 7 d hit rates."""
    storage_of(request, cache)
    state = state_of(request)
    tag = conditional.etag(state.generations.get(cache), clock=True)
    if conditional.matches(request, tag):
        return conditional.not_modified(tag)
    body = StatsModel(**state.stats(cache)).model_dump_json().encode()
    return Response(body, media_type="application/json", headers=conditional.headers(tag))


@router.post("/v1/caches/{cache}/rescan", response_model=RescanModel, operation_id="rescan",
             responses={409: {"model": ErrorModel, "description": "another replica has been rescanning this cache "
                                                                  "for a minute: try again when it ends"}})
def post_rescan(request: Request, cache: CacheName, _p: AdminAuth) -> RescanModel:
    """Rescan one cache's entries and new or changed run records now."""
    storage_of(request, cache)
    r = rescans.rescan(state_of(request), cache, wait_s=RESCAN_WAIT_S)
    return RescanModel(cache=r.cache, added=r.added, removed=r.removed, updated=r.updated, entries=r.entries,
                       seconds=r.seconds, records_ingested=r.records_ingested,
                       records_malformed=r.records_malformed, warmups_ingested=r.warmups_ingested,
                       records_compacted=r.records_compacted, skipped=r.skipped)
