"""Run records POSTed by jobs (``POST /v1/reports``), and the record's schema in the API's OpenAPI document."""

from __future__ import annotations

import logging
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Response
from starlette.requests import ClientDisconnect

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.service.metrics import REPORT
from jaxcache.service.reports.ingest import queue
from jaxcache.service.reports.ingest.schemas import ReportResult
from jaxcache.service.state import State
from jaxcache.service.web.deps import ERRORS, UNPROCESSABLE, ReportAuth, state_of, storage_of, unroutable
from jaxcache.service.web.fields import ErrorModel
from jaxcache.service.web.middleware import ABORTED, REPORTS_PATH

router = APIRouter(tags=["reports"])

log = logging.getLogger("jaxcache.service")

#: The catalog counts processes in 32-bit columns (PostgreSQL's INTEGER); the record format allows up to 2**53.
MAX_PROCESSES = 2**31 - 1


@router.post(
    REPORTS_PATH, response_model=ReportResult, status_code=202, operation_id="ingestReport",
    responses={
        **ERRORS,
        404: {"model": ErrorModel, "description": "no cache of that name, or (without `cache`) none whose root is "
                                                  "the record's cache_dir"},
        413: {"model": ErrorModel, "description": "body over JAXCACHE_MAX_REPORT_BYTES"},
        422: {**UNPROCESSABLE, "description": "malformed run record (nothing stored), several caches have its "
                                              "cache_dir as root (pass `cache`), or `cache` names one whose root "
                                              "it is not while its cache_dir is another cache's root"},
        503: {"model": ErrorModel, "description": "JAXCACHE_REPORT_INBOX records are already waiting for the "
                                                  "catalog: send it again after Retry-After seconds (its record "
                                                  "file reaches the catalog at the next rescan anyway)",
              "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}}},
    },
    openapi_extra={"requestBody": {"required": True, "description": "a run record (jaxcache.run/1)",
                                   "content": {"application/json": {"schema": records.json_schema()[0]}}}},
)
async def ingest_report(
    request: Request, _p: ReportAuth,
    cache: Annotated[str | None, Query(max_length=64, description="the cache the record is for; default: the "
                                       "configured cache whose root is the record's cache_dir (a record whose "
                                       "cache_dir is another cache's root is refused, 422)",
                                       examples=["prod"])] = None,
) -> ReportResult | Response:
    """Accept a run record (what a job's process did with each key) into the catalog's inbox. Needs a `report` or
    `admin` token.

    Answered once the record is stored; the catalog's figures show it once the drain has folded it, within
    seconds. Records are totals so far: sending one again, or an older version of it, changes nothing."""
    state = state_of(request)
    if cache is not None:
        storage_of(request, cache)
    try:
        body = await request.body()
    except ClientDisconnect:
        # The job gave up mid-upload (its timeout, a restart): nothing to answer, nothing wrong with the service.
        log.info("a run record's upload ended before its body did (the client went away)")
        request.scope[ABORTED] = True
        return Response(status_code=400)  # never reaches the client
    # One hop to the framework's pool, one report at a time (anyio's limiter): parsing in many threads at once took
    # the interpreter lock from the event loop (/healthz).
    accepted = await anyio.to_thread.run_sync(_accept, state, body, cache, limiter=state.report_limiter)
    state.loops.wake_drain()
    return ReportResult(cache=accepted.cache, run_id=accepted.run_id, process_index=accepted.process_index,
                        runs=0 if accepted.stale else 1, keys=accepted.keys, stale=accepted.stale)


def _accept(state: State, body: bytes, cache: str | None) -> queue.Accepted:
    """Parse the record in ``body`` (once), find the cache it is for and put it into the inbox; 422/404 (counted
    as malformed) for a record that is refused, 503 for a full inbox (web/errors.py)."""
    try:
        record = records.parse(body)
        if record.process_count > MAX_PROCESSES:
            raise InvalidInputError(f"run record is malformed: process_count {record.process_count} is over "
                                    f"{MAX_PROCESSES}, the most the catalog counts")
    except InvalidInputError as exc:
        raise _malformed(state, 422, exc) from None
    if cache is not None and (owners := state.filed_elsewhere(record.cache_dir, cache)):
        fix = (f"post it with ?cache={owners[0]} or without ?cache=" if len(owners) == 1 else
               f"post it with ?cache= one of {', '.join(owners)}")
        raise _malformed(state, 422, f"the record's cache_dir {record.cache_dir!r} is the root of "
                                     f"{'cache' if len(owners) == 1 else 'caches'} {', '.join(owners)}, not of "
                                     f"{cache}: {fix}; nothing stored")
    try:
        name = cache if cache is not None else state.cache_for(record.cache_dir)
    except InvalidInputError as exc:
        raise _malformed(state, unroutable(state, record.cache_dir)[0], exc) from None
    try:
        return queue.accept(state.catalog, name, record, body, limit=state.settings.report_inbox)
    except InvalidInputError as exc:  # a key listed twice
        raise _malformed(state, 422, exc) from None


def _malformed(state: State, status: int, why: object) -> HTTPException:
    state.metrics.reports_malformed.labels(REPORT).inc()
    return HTTPException(status, str(why))


def document_record_schema(app: FastAPI) -> None:
    """Document the run record as the body of POST /v1/reports, from the record format's own schema
    (jaxcache.records, the one validator). The route reads the raw body (auth must come before parsing), so
    FastAPI cannot see it by itself."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = app.openapi_schema
        if schema is None:
            schema = build()  # FastAPI's keeps it as app.openapi_schema
            # The components keep the record format's own names (RunRecord, KeyUsage, Fingerprint): its refs
            # already point at them, and no earlier document used others.
            body, found = records.json_schema()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(found)
            fields = components[body["$ref"].rsplit("/", 1)[1]]["properties"]
            for field, most in (("process_count", MAX_PROCESSES), ("process_index", MAX_PROCESSES - 1)):
                fields[field] = {**{k: v for k, v in fields[field].items() if k != "exclusiveMaximum"},
                                 "maximum": most}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
