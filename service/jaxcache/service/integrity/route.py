"""Integrity: passes on demand, and the verdicts by cache or by the root a job names."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request

from jaxcache.service.catalog import attestations
from jaxcache.service.integrity import queries as verdicts
from jaxcache.service.integrity import verification
from jaxcache.service.integrity.schemas import (
    MAX_DIGEST_KEYS,
    AttestedDigest,
    AttestedDigests,
    DigestsRequest,
    IntegritySummary,
    VerifyRequest,
    VerifyResult,
)
from jaxcache.service.integrity.verification import Scanned
from jaxcache.service.web import deps
from jaxcache.service.web.deps import ERRORS, AdminAuth, CacheDir, CacheName, ReadAuth, ReadOrReportAuth, state_of
from jaxcache.service.web.fields import ErrorModel


def routes(ensure_scanned: Scanned) -> APIRouter:
    """The routes; a pass asked for first rescans a cache this process has not seen scanned (``ensure_scanned``)."""
    router = APIRouter(tags=["integrity"], responses=ERRORS)

    @router.post("/v1/caches/{cache}/verify", response_model=VerifyResult, operation_id="verify",
                 responses={413: {"model": ErrorModel, "description": "body over JAXCACHE_MAX_BODY_BYTES"}})
    def post_verify(request: Request, cache: CacheName, _p: AdminAuth,
                    body: VerifyRequest | None = None) -> VerifyResult:
        """Verify new, changed and pending entries (or all, with `recheck_all`) now, unthrottled."""
        deps.storage_of(request, cache)
        body = body or VerifyRequest()
        return verification.verify(state_of(request), cache, ensure_scanned=ensure_scanned,
                                   max_entries=body.max_entries, recheck_all=body.recheck_all)

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

    @router.post("/v1/integrity/digests", response_model=AttestedDigests, operation_id="getAttestedDigests",
                 responses={**deps.BY_DIR_ERRORS,
                            413: {"model": ErrorModel, "description": "body over JAXCACHE_MAX_BODY_BYTES"},
                            422: {**deps.UNPROCESSABLE, "description": "several configured caches have this root, more "
                                  "than 10,000 keys, or the request does not match the schema"}})
    def post_digests(request: Request, _p: ReadOrReportAuth, body: DigestsRequest) -> AttestedDigests:
        """The digests the entries of `keys` are judged against, by root, as `enable_cache(verify="attested")` asks
        them for its node-local tier's copies; a `report` token is enough. At most 10,000 keys a request."""
        if len(body.keys) > MAX_DIGEST_KEYS:
            raise HTTPException(422, f"{len(body.keys)} keys: ask about at most {MAX_DIGEST_KEYS} a request")
        name = deps.cache_of_dir(request, body.cache_dir, "integrity")
        with state_of(request).catalog.reader() as conn:
            found = attestations.load(conn, name, body.keys)
            conflicts = attestations.conflicts(conn, name, limit=MAX_DIGEST_KEYS, keys=sorted(found))
        digests = {k: AttestedDigest(sha256=a.sha256, size_bytes=a.size_bytes, writer=a.writer)
                   for k, a in found.items()}
        return AttestedDigests(cache=name, digests=digests, conflicts=conflicts)

    return router
