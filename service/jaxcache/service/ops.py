"""Operations: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import time
from dataclasses import asdict

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import select

from jaxcache.errors import JaxcacheError
from jaxcache.service.background import export_health
from jaxcache.service.state import State
from jaxcache.service.web.deps import state_of
from jaxcache.service.web.fields import Health, LoopModel, Readiness

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health, operation_id="healthz")
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, operation_id="readyz",
            responses={503: {"model": Readiness, "description": "not ready"}})
def readyz(request: Request) -> Response:
    """Ready once the catalog answers and every cache is scanned and reachable; ``loops`` never makes it unready."""
    state = state_of(request)
    detail: dict[str, str] = {}
    try:
        with state.catalog.session() as s:
            s.execute(select(1))
    except Exception as exc:  # any database failure means not ready
        detail["catalog"] = f"unreachable: {exc.__class__.__name__}"
    if not detail and set(state.storages) - state.scanned:
        state.follow()  # another replica may have done the first scan
    for name, storage in state.storages.items():
        if name not in state.scanned:
            detail[name] = "first scan not finished"
            continue
        try:
            storage.ping()
        except JaxcacheError as exc:
            detail[name] = str(exc)
    body = Readiness(status="not ready" if detail else "ok", detail=detail, loops=loop_models(state))
    return JSONResponse(body.model_dump(), status_code=503 if detail else 200)


def loop_models(state: State) -> dict[str, LoopModel]:
    """The background loops as ``/readyz`` shows them (the dashboard too)."""
    now = time.time()
    return {name: LoopModel.model_validate({  # the model takes the status's fields it shows
        **asdict(status), "state": status.health(now), "caches": status.cache_health(state.settings.caches, now),
    }) for name, status in state.loops.shared().items()}


@router.get("/metrics", operation_id="metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
def metrics(request: Request) -> Response:
    """Prometheus metrics: catalog entries and bytes, scans, prunes, reports, misses, integrity, loops, latency."""
    state = state_of(request)
    export_health(state.metrics, state.loops.shared(), time.time())
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")
