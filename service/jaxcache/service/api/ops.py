"""Operations: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import select

from jaxcache.errors import JaxcacheError
from jaxcache.service.api.deps import state_of
from jaxcache.service.api.schemas.common import Health, LoopModel, Readiness

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health, operation_id="healthz")
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


def _readiness(request: Request) -> dict[str, str]:
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
    return detail


@router.get("/readyz", response_model=Readiness, operation_id="readyz",
            responses={503: {"model": Readiness, "description": "not ready"}})
def readyz(request: Request) -> Response:
    """The catalog answers, every cache has been scanned once, and every storage is reachable. ``loops``: how
    the background loops are doing (a failing loop does not make the replica unready: it serves what it has)."""
    detail = _readiness(request)
    ok = not detail
    loops = {name: LoopModel.model_validate(status, from_attributes=True)
             for name, status in state_of(request).loop_snapshot().items()}
    body = Readiness(status="ok" if ok else "not ready", detail=detail, loops=loops)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@router.get("/metrics", operation_id="metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
def metrics(request: Request) -> Response:
    """Prometheus metrics: the catalog's entries and bytes, scans, prunes, reports, misses, integrity, background
    loops, request latency, and hit rates read from the catalog (README, "API")."""
    return Response(state_of(request).metrics.render(), media_type="text/plain; version=0.0.4")
