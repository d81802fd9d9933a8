"""Integrity: passes on demand, and the verdicts by cache or by the root a job names."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from jaxcache.service.integrity import queries as verdicts
from jaxcache.service.integrity import verification
from jaxcache.service.integrity.schemas import IntegritySummary, VerifyRequest, VerifyResult
from jaxcache.service.web import deps
from jaxcache.service.web.deps import ERRORS, AdminAuth, CacheDir, CacheName, ReadAuth, ReadOrReportAuth, state_of
from jaxcache.service.web.fields import ErrorModel

router = APIRouter(tags=["integrity"], responses=ERRORS)


@router.post("/v1/caches/{cache}/verify", response_model=VerifyResult, operation_id="verify",
             responses={413: {"model": ErrorModel, "description": "body over JAXCACHE_MAX_BODY_BYTES"}})
def post_verify(request: Request, cache: CacheName, _p: AdminAuth,
                body: VerifyRequest | None = None) -> VerifyResult:
    """Verify new, changed and pending entries (or all, with `recheck_all`) now, unthrottled."""
    deps.storage_of(request, cache)
    body = body or VerifyRequest()
    return verification.verify(state_of(request), cache, max_entries=body.max_entries, recheck_all=body.recheck_all)


@router.get("/v1/caches/{cache}/integrity", response_model=IntegritySummary, operation_id="getIntegrity")
def get_integrity(request: Request, cache: CacheName, _p: ReadAuth) -> IntegritySummary:
    """Integrity of the cache's entries by class, and every tampered, mismatched, corrupt or pending one."""
    deps.storage_of(request, cache)
    with state_of(request).catalog.reader() as conn:
        return IntegritySummary(**verdicts.summary(conn, cache))


@router.get("/v1/integrity", response_model=IntegritySummary, operation_id="getIntegrityByDir",
            responses=deps.BY_DIR_ERRORS)
def get_integrity_by_dir(
    request: Request, _p: ReadOrReportAuth, cache_dir: CacheDir,
    limit: Annotated[int, Query(ge=1, le=100_000, description="at most this many problems and conflicts")] = 1000,
) -> IntegritySummary:
    """The same summary by root, as `enable_cache(verify="attested")` asks it; a `report` token is enough."""
    name = deps.cache_of_dir(request, cache_dir, "integrity")
    with state_of(request).catalog.reader() as conn:
        return IntegritySummary(**verdicts.summary(conn, name, limit=limit))
