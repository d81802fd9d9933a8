"""Rescans on demand."""

from __future__ import annotations

from fastapi import APIRouter, Request

from jaxcache.service.rescan.scan import rescan_cache
from jaxcache.service.rescan.schemas import RescanModel
from jaxcache.service.web.deps import ERRORS, AdminAuth, CacheName, state_of, storage_of
from jaxcache.service.web.fields import ErrorModel

router = APIRouter(tags=["caches"], responses=ERRORS)

#: How long POST /v1/caches/{cache}/rescan waits for a rescan another replica is running before it answers 409.
RESCAN_WAIT_S = 60.0


@router.post("/v1/caches/{cache}/rescan", response_model=RescanModel, operation_id="rescan",
             responses={409: {"model": ErrorModel, "description": "another replica has been rescanning this cache "
                                                                  "for a minute: try again when it ends"}})
def post_rescan(request: Request, cache: CacheName, _p: AdminAuth) -> RescanModel:
    """Rescan one cache's entries and new or changed run records now."""
    storage_of(request, cache)
    return rescan_cache(state_of(request), cache, wait_s=RESCAN_WAIT_S)
