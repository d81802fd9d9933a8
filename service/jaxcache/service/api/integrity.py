"""Integrity: passes on demand, and the verdicts by cache or by the root a job names."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request

from jaxcache.errors import InvalidInputError
from jaxcache.service.api.deps import (
    ERRORS,
    UNPROCESSABLE,
    AdminAuth,
    CacheName,
    ReadAuth,
    ReadOrReportAuth,
    state_of,
    storage_of,
    unroutable,
)
from jaxcache.service.api.schemas.common import ErrorModel
from jaxcache.service.api.schemas.fields import CACHE_DIR
from jaxcache.service.api.schemas.integrity import IntegritySummary, VerifyRequest, VerifyResult
from jaxcache.service.catalog.queries import verdicts
from jaxcache.service.ingestion import routing
from jaxcache.service.operations import verifying

router = APIRouter(tags=["integrity"], responses=ERRORS)


@router.post("/v1/caches/{cache}/verify", response_model=VerifyResult, operation_id="verify",
             responses={413: {"model": ErrorModel, "description": "body over JAXCACHE_MAX_BODY_BYTES"}})
def post_verify(request: Request, cache: CacheName, _p: AdminAuth,
                body: VerifyRequest | None = None) -> VerifyResult:
    """Verify entries now, unthrottled: new, changed and pending ones (or all with `recheck_all`). Each is
    read, compared with its writer's digest and its embedded program name, and classified ok, tampered,
    mismatched, corrupt, pending (younger than JAXCACHE_VERIFY_MIN_AGE_S) or unattested. The background pass
    does the same, throttled to JAXCACHE_VERIFY_BYTES_PER_S."""
    storage_of(request, cache)
    body = body or VerifyRequest()
    r = verifying.verify(state_of(request), cache, max_entries=body.max_entries, recheck_all=body.recheck_all)
    return VerifyResult(cache=r.cache, checked=r.checked, bytes_read=r.bytes_read, counts=r.counts,
                        remaining=r.remaining, seconds=r.seconds)


@router.get("/v1/caches/{cache}/integrity", response_model=IntegritySummary, operation_id="getIntegrity")
def get_integrity(request: Request, cache: CacheName, _p: ReadAuth) -> IntegritySummary:
    """Integrity of the cache's entries by class, and every tampered, mismatched, corrupt or pending one."""
    storage_of(request, cache)
    with state_of(request).catalog.reader() as conn:
        return IntegritySummary(**verdicts.summary(conn, cache))


@router.get("/v1/integrity", response_model=IntegritySummary, operation_id="getIntegrityByDir",
            responses={404: {"model": ErrorModel, "description": "no configured cache has this root"},
                       422: {**UNPROCESSABLE, "description": "several configured caches have this root, or the "
                                                             "request does not match the schema"}})
def get_integrity_by_dir(
    request: Request, _p: ReadOrReportAuth,
    cache_dir: Annotated[str, Query(max_length=1024, pattern=CACHE_DIR,
                                    description="a cache root as a job spells it: an absolute directory, a file:// "
                                                "URL of one, or gs://bucket/prefix", examples=["/mnt/jax-cache"])],
    limit: Annotated[int, Query(ge=1, le=100_000, description="at most this many problems and conflicts")] = 1000,
) -> IntegritySummary:
    """The same summary, for the cache whose root is `cache_dir`: what `enable_cache(verify="attested")` asks
    before a job starts, to skip the entries judged bad. A `report` token (the job's) is enough."""
    state = state_of(request)
    try:
        name = routing.cache_for_dir(cache_dir, state.roots)
    except InvalidInputError:
        status, sharing = unroutable(cache_dir, state.roots)
        said = (f"caches {', '.join(sharing)} share the root {cache_dir!r}: ask GET /v1/caches/NAME/integrity"
                if sharing else f"no configured cache has the root {cache_dir!r}: GET /v1/caches lists them")
        raise HTTPException(status, said) from None
    with state.catalog.reader() as conn:
        return IntegritySummary(**verdicts.summary(conn, name, limit=limit))
