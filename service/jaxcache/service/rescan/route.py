"""Rescans on demand: the round's rescan (rounds.rescan_cache), handed in by app.py."""

from __future__ import annotations

from fastapi import APIRouter, Request

from jaxcache.service.rescan.scan import Rescan
from jaxcache.service.rescan.schemas import RescanModel
from jaxcache.service.web.deps import ERRORS, AdminAuth, CacheName, storage_of
from jaxcache.service.web.fields import ErrorModel

#: How long POST /v1/caches/{cache}/rescan waits for a rescan another replica is running before it answers 409.
RESCAN_WAIT_S = 60.0


def routes(rescan: Rescan) -> APIRouter:
    """The route, running ``rescan``."""
    router = APIRouter(tags=["caches"], responses=ERRORS)

    @router.post("/v1/caches/{cache}/rescan", response_model=RescanModel, operation_id="rescan",
                 responses={409: {"model": ErrorModel, "description": "another replica has been rescanning this "
                                                                      "cache for a minute: try again when it ends"}})
    def post_rescan(request: Request, cache: CacheName, _p: AdminAuth) -> RescanModel:
        """Rescan one cache's entries and new or changed run records now."""
        storage_of(request, cache)
        return rescan(cache, wait_s=RESCAN_WAIT_S)

    return router
