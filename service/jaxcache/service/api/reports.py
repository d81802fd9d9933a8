"""Run records POSTed by jobs (``POST /v1/reports``), and the record's schema in the API's OpenAPI document."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.service.api.deps import ERRORS, ReportAuth, state_of, storage_of
from jaxcache.service.api.schemas.common import ErrorModel
from jaxcache.service.api.schemas.reports import ReportErrorModel, ReportResult
from jaxcache.service.ingestion import reports as ingestion
from jaxcache.service.ingestion import routing
from jaxcache.service.middleware import REPORTS_PATH

router = APIRouter(tags=["reports"])


@router.post(
    REPORTS_PATH, response_model=ReportResult, operation_id="ingestReport",
    responses={
        **ERRORS,
        413: {"model": ErrorModel, "description": "body over JAXCACHE_MAX_REPORT_BYTES"},
        422: {"model": ReportErrorModel,
              "description": "malformed run record (nothing stored), or no cache given and none matches"},
    },
    openapi_extra={"requestBody": {"required": True, "description": "a run record (jaxcache.run/1)",
                                   "content": {"application/json": {
                                       "schema": {"$ref": "#/components/schemas/RunRecordModel"}}}}},
)
async def ingest_report(
    request: Request, _p: ReportAuth,
    cache: Annotated[str | None, Query(max_length=64, description="the cache the record is for; default: the "
                                       "configured cache whose root is the record's cache_dir")] = None,
) -> ReportResult:
    """Ingest a run record (what a job's process did with each key). Needs a `report` or `admin` token.

    Records are totals so far: sending one again, or an older version of it, changes nothing."""
    state = state_of(request)
    if cache is not None:
        storage_of(request, cache)
    body = await request.body()
    try:
        record = records.parse(body)
        name = cache if cache is not None else routing.cache_for(record, state.roots)
    except InvalidInputError as exc:
        state.metrics.reports_malformed.labels(ingestion.REPORT).inc()
        raise HTTPException(422, str(exc)) from None
    try:
        r = await run_in_threadpool(state.ingest, name, record)
    except InvalidInputError as exc:
        state.metrics.reports_malformed.labels(ingestion.REPORT).inc()
        raise HTTPException(422, str(exc)) from None
    return ReportResult(cache=r.cache, run_id=r.run_id, process_index=r.process_index,
                        runs=0 if r.stale else 1, keys=r.keys, stale=r.stale)


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
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
