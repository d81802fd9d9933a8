"""Prunes and pins: plan or apply a policy, delete one entry, the audit log, and the keys or globs that prunes never
delete."""

from __future__ import annotations

import time
from typing import Annotated, Any, cast

from fastapi import APIRouter, BackgroundTasks, HTTPException, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy import CursorResult, delete, select

from jaxcache.service import memory
from jaxcache.service.catalog.models import PinRow
from jaxcache.service.prune import audit, run, schemas
from jaxcache.service.prune.run import EntryNotDeletedError, Handed, PruneInProgressError
from jaxcache.service.prune.schemas import PinList, PinModel, PruneAudit, PruneAuditList, PruneRequest, PruneResponse
from jaxcache.service.web import deps, fields
from jaxcache.service.web.deps import BEARER_REQUIRED, ERRORS, AdminAuth, CacheName, EntryKey, ReadAuth, state_of
from jaxcache.service.web.fields import ErrorModel

PinPattern = Annotated[str, Path(max_length=256, pattern=fields.PIN, examples=["jit_train*"],
                                 description="an entry key, or a glob over keys and function names")]


def routes(handed: Handed) -> APIRouter:
    """The routes; prunes and single-entry deletes run what ``handed`` holds (app.py hands it in)."""
    router = APIRouter(tags=["prune"], responses=ERRORS)

    @router.post("/v1/caches/{cache}/prune", response_model=PruneResponse, operation_id="prune",
                 responses={409: {"model": ErrorModel,
                                  "description": "a prune of this cache is running (on any replica)"},
                            413: {"model": ErrorModel, "description": "body over JAXCACHE_MAX_BODY_BYTES"}},
                 openapi_extra=BEARER_REQUIRED)  # the token is checked in the route: its scope depends on dry_run
    def post_prune(request: Request, cache: CacheName, body: PruneRequest, background: BackgroundTasks) -> Response:
        """Plan a prune (default: dry run) or, with `dry_run: false` and an admin token, apply it."""
        state = state_of(request)
        principal = state.auth.check(request, "read" if body.dry_run else "admin")
        deps.storage_of(request, cache)
        policy, policy_json = schemas.policy_of(body)
        try:
            outcome = run.prune(state, cache, policy, handed=handed, policy_json=policy_json,
                                dry_run=body.dry_run, who=principal.who)
        except PruneInProgressError:
            raise HTTPException(409, f"a prune of {cache!r} is already running (on this or another replica of the "
                                     "service); try again when it ends") from None
        if outcome.plan.entries_total >= state.settings.release_memory_from_entries:
            background.add_task(memory.release)  # once the answer is sent
        # Streamed a part at a time, so a long plan's answer is never whole in memory.
        return StreamingResponse(schemas.encoded_response(outcome, dry_run=body.dry_run, limit=body.list_limit),
                                 media_type="application/json")

    @router.get("/v1/caches/{cache}/prunes", response_model=PruneAuditList, operation_id="listPrunes")
    def list_prunes(request: Request, cache: CacheName, _p: ReadAuth,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> PruneAuditList:
        """Applied prunes, newest first: who, when, policy, counts, bytes."""
        deps.storage_of(request, cache)
        with state_of(request).catalog.reader() as conn:
            return PruneAuditList(prunes=[PruneAudit(**r) for r in audit.prunes(conn, cache, limit=limit)])

    @router.get("/v1/caches/{cache}/pins", response_model=PinList, operation_id="listPins")
    def list_pins(request: Request, cache: CacheName, _p: ReadAuth) -> PinList:
        """Keys and globs that prunes never delete."""
        deps.storage_of(request, cache)
        with state_of(request).catalog.session() as s:
            rows = s.scalars(select(PinRow).where(PinRow.cache == cache).order_by(PinRow.pattern))
            return PinList(pins=[PinModel.model_validate(r, from_attributes=True) for r in rows])

    @router.put("/v1/caches/{cache}/pins/{pattern}", response_model=PinModel, operation_id="putPin")
    def put_pin(request: Request, cache: CacheName, pattern: PinPattern, p: AdminAuth) -> PinModel:
        """Protect entries matching `pattern` (a key, or a glob such as `jit_train*`) from every prune."""
        deps.storage_of(request, cache)
        catalog = state_of(request).catalog
        with catalog.session() as s:
            # An upsert that keeps the first pin: two replicas may get the same PUT.
            s.execute(catalog.insert(PinRow)
                      .values(cache=cache, pattern=pattern, created_s=time.time(), created_by=p.who)
                      .on_conflict_do_nothing(index_elements=["cache", "pattern"]))
            return PinModel.model_validate(s.get(PinRow, (cache, pattern)), from_attributes=True)

    @router.delete("/v1/caches/{cache}/pins/{pattern}", status_code=204, operation_id="deletePin")
    def delete_pin(request: Request, cache: CacheName, pattern: PinPattern, _p: AdminAuth) -> Response:
        """Remove a pin."""
        deps.storage_of(request, cache)
        with state_of(request).catalog.session() as s:  # a write without a read first: see rescan/scan.py
            result = s.execute(delete(PinRow).where(PinRow.cache == cache, PinRow.pattern == pattern))
            gone = cast(CursorResult[Any], result).rowcount  # Session.execute is typed for any statement
        if not gone:
            raise HTTPException(404, f"no pin {pattern!r} on {cache!r}")
        return Response(status_code=204)

    @router.delete("/v1/caches/{cache}/entries/{key}", status_code=204, operation_id="deleteEntry",
                   responses={409: {"model": ErrorModel, "description": "a prune of this cache is running, the entry"
                                                                         " was written again since it was listed, or"
                                                                         " its file could not be removed (the detail"
                                                                         " says why; the entry stays listed)"}})
    def delete_entry(request: Request, cache: CacheName, key: EntryKey, principal: AdminAuth,
                     background: BackgroundTasks) -> Response:
        """Delete one entry (its -cache, then its -atime, under JAX's lock), audited as a prune of one in
        `GET /v1/caches/{cache}/prunes`. Jobs that need it recompile and write it again."""
        state = state_of(request)
        deps.storage_of(request, cache)
        deps.check_key(key)
        try:
            deleted = run.delete_entry(state, cache, key, handed=handed, who=principal.who)
        except PruneInProgressError:
            raise HTTPException(409, f"a prune of {cache!r} is running (on this or another replica of the service);"
                                     " try again when it ends") from None
        except EntryNotDeletedError as exc:
            # Not 502: storage answered, and retrying changes nothing until someone fixes what the detail names.
            raise HTTPException(409, str(exc)) from None
        if not deleted:
            raise HTTPException(404, f"no entry {key!r} in {cache!r}")
        # The cache's statistics, computed once the answer is sent: a whole-cache pass that one entry must not wait for.
        background.add_task(handed.keep, cache)
        return Response(status_code=204)

    return router
