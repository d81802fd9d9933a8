"""Run records POSTed by jobs (``POST /v1/reports``), and the record's schema in the API's OpenAPI document."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import anyio.to_thread
import orjson
from fastapi import APIRouter, FastAPI, HTTPException, Query, Request

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.service.api.deps import ERRORS, UNPROCESSABLE, ReportAuth, state_of, storage_of, unroutable
from jaxcache.service.api.schemas.common import ErrorModel
from jaxcache.service.api.schemas.reports import ReportResult
from jaxcache.service.ingestion import reports as ingestion
from jaxcache.service.ingestion import routing
from jaxcache.service.ingestion.packed import Report, report_of, report_of_json
from jaxcache.service.middleware import REPORTS_PATH
from jaxcache.service.state import State

router = APIRouter(tags=["reports"])

#: Records a process parses at once, each in a thread of its own. One: a process runs one thread of Python at a
#: time anyway, and each parsing thread more took the interpreter lock from the event loop (bench/reports.py, a
#: storm's final records: /healthz p99 69 ms with FastAPI's pool of 40 threads, 27 ms with one, as many records/s).
PARSERS = 1


def _parsing(request: Request) -> anyio.CapacityLimiter:
    """The app's limiter of parsing threads, made at its first record (an anyio limiter needs a running loop)."""
    found: anyio.CapacityLimiter | None = getattr(request.app.state, "report_parsers", None)
    if found is None:
        found = request.app.state.report_parsers = anyio.CapacityLimiter(PARSERS)
    return found


@router.post(
    REPORTS_PATH, response_model=ReportResult, operation_id="ingestReport",
    responses={
        **ERRORS,
        404: {"model": ErrorModel, "description": "no cache of that name, or (without `cache`) none whose root is "
                                                  "the record's cache_dir"},
        413: {"model": ErrorModel, "description": "body over JAXCACHE_MAX_REPORT_BYTES"},
        422: {**UNPROCESSABLE, "description": "malformed run record (nothing stored), or several caches have its "
                                              "cache_dir as root (pass `cache`)"},
        503: {"model": ErrorModel, "description": "JAXCACHE_REPORT_QUEUE records are already waiting for the "
                                                  "catalog: send it again after Retry-After seconds (its record "
                                                  "file reaches the catalog at the next rescan anyway)",
              "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}}},
    },
    openapi_extra={"requestBody": {"required": True, "description": "a run record (jaxcache.run/1)",
                                   "content": {"application/json": {
                                       "schema": {"$ref": "#/components/schemas/RunRecordModel"}}}}},
)
async def ingest_report(
    request: Request, _p: ReportAuth,
    cache: Annotated[str | None, Query(max_length=64, description="the cache the record is for; default: the "
                                       "configured cache whose root is the record's cache_dir",
                                       examples=["prod"])] = None,
) -> ReportResult:
    """Ingest a run record (what a job's process did with each key). Needs a `report` or `admin` token.

    Records are totals so far: sending one again, or an older version of it, changes nothing."""
    state = state_of(request)
    if cache is not None:
        storage_of(request, cache)
    state.reports.check_room()  # a full queue answers 503 before the body is parsed
    with state.reports.arriving() as arrival:  # the writer waits a moment for this record to join its batch
        body = await request.body()
        # Up to JAXCACHE_MAX_REPORT_BYTES of JSON: parsed in a worker thread, so that the loop keeps answering.
        report, name = await anyio.to_thread.run_sync(_accept, state, body, cache, limiter=_parsing(request))
        try:
            # Waits for the writer thread's batch without holding a thread of the pool.
            r = await state.reports.ingest(name, report, arrival)
        except InvalidInputError as exc:
            state.metrics.reports_malformed.labels(ingestion.REPORT).inc()
            raise HTTPException(422, str(exc)) from None
    return ReportResult(cache=r.cache, run_id=r.run_id, process_index=r.process_index,
                        runs=0 if r.stale else 1, keys=r.keys, stale=r.stale)


def _accept(state: State, body: bytes, cache: str | None) -> tuple[Report, str]:
    """The record in ``body`` as ingestion takes it, and the cache it is for, or 422/404 (counted as
    malformed)."""
    try:
        report = _parse(body)
        ingestion.check_keys(report.keys)
    except InvalidInputError as exc:
        state.metrics.reports_malformed.labels(ingestion.REPORT).inc()
        raise HTTPException(422, str(exc)) from None
    try:
        return report, cache if cache is not None else routing.cache_for(report.header, state.roots)
    except InvalidInputError as exc:
        state.metrics.reports_malformed.labels(ingestion.REPORT).inc()
        raise HTTPException(unroutable(report.header.cache_dir, state.roots)[0], str(exc)) from None


#: The catalog counts processes in 32-bit columns (PostgreSQL's INTEGER); the record format allows up to 2**53.
MAX_PROCESSES = 2**31 - 1


def _parse(body: bytes) -> Report:
    report = _decoded(body)
    if report.header.process_count > MAX_PROCESSES:
        raise InvalidInputError(f"run record is malformed: process_count {report.header.process_count} is over "
                                f"{MAX_PROCESSES}, the most the catalog counts")
    return report


def _decoded(body: bytes) -> Report:
    try:
        return report_of_json(body)
    except InvalidInputError as exc:
        # JSON Schema, so the OpenAPI document, counts 3.0 as an integer; the record format does not. Only a
        # refused record pays for a second look.
        refused = exc
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise refused from None
    seen: list[float] = []
    fixed = _integral(data, seen)
    if not seen:
        raise refused
    return report_of(records.parse(fixed))


def _integral(node: Any, seen: list[float]) -> Any:
    """``node`` with every integral float that an int holds exactly (below 2**53) as that int, listed in ``seen``."""
    if isinstance(node, float) and node.is_integer() and abs(node) < 2**53:
        seen.append(node)
        return int(node)
    if isinstance(node, dict):
        return {k: _integral(v, seen) for k, v in node.items()}
    if isinstance(node, list):
        return [_integral(v, seen) for v in node]
    return node


#: The run record's components in the OpenAPI document, by the names earlier versions of the document used.
_COMPONENT_NAMES = {"RunRecord": "RunRecordModel", "KeyUsage": "KeyUsageModel", "Fingerprint": "FingerprintModel"}


def _renamed(node: Any) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            name = ref.rsplit("/", 1)[1]
            return {**node, "$ref": f"#/components/schemas/{_COMPONENT_NAMES.get(name, name)}"}
        return {k: _renamed(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_renamed(v) for v in node]
    return node


def document_record_schema(app: FastAPI) -> None:
    """Document the run record as the body of POST /v1/reports, from the record format's own schema
    (jaxcache.records, the one validator). The route reads the raw body (auth must come before parsing), so
    FastAPI cannot see it by itself."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = app.openapi_schema
        if schema is None:
            schema = build()  # FastAPI's keeps it as app.openapi_schema
            _, found = records.json_schema()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, sub in found.items():
                components[_COMPONENT_NAMES.get(name, name)] = _renamed(sub)
            fields = components["RunRecordModel"]["properties"]
            for field, most in (("process_count", MAX_PROCESSES), ("process_index", MAX_PROCESSES - 1)):
                fields[field] = {**{k: v for k, v in fields[field].items() if k != "exclusiveMaximum"},
                                 "maximum": most}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
