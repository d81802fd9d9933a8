"""Operations: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import UTC, datetime

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import select

from jaxcache.service.background import export_health
from jaxcache.service.reachability import Reach
from jaxcache.service.state import State
from jaxcache.service.web.deps import state_of
from jaxcache.service.web.fields import Health, LoopModel, Readiness
from jaxcache.storage.base import ObjectStore

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health, operation_id="healthz")
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


class RootModel(BaseModel):
    """A cache's root as this process last looked at it (within JAXCACHE_REACH_S; again when asked, 10 s on)."""

    reachable: bool | None = Field(description="whether the root answered the last look; null before the first ends")
    unreachable_since_s: float | None = Field(None, description="when the looks began to fail (null while it answers)")
    error: str | None = Field(None, description="why the last look failed: the store's error, or no answer in time")
    looked_s: float | None = Field(None, description="when the last look ended")


class ReadinessModel(Readiness):
    roots: dict[str, RootModel] = Field(default_factory=dict, description="each cache's root, as this process last "
                                        "looked at it: a scanned cache whose object store cannot be reached makes the "
                                        "status `degraded` (still 200); a directory root that cannot, or a cache never "
                                        "scanned, makes the replica unready")


@router.get("/readyz", response_model=ReadinessModel, operation_id="readyz",
            responses={503: {"model": ReadinessModel, "description": "not ready"}})
def readyz(request: Request) -> Response:
    """Ready (200) once the catalog answers and every cache is scanned; ``degraded`` (200, ``detail`` naming it)
    while a scanned cache's object store does not answer; a directory root gone makes it unready, ``loops``
    never. No store is asked while answering: a look older than 10 s is taken again in the background."""
    state = state_of(request)
    detail: dict[str, str] = {}
    unready = False
    try:
        with state.catalog.session() as s:
            s.execute(select(1))
    except Exception as exc:  # any database failure means not ready
        detail["catalog"] = f"unreachable: {exc.__class__.__name__}"
        unready = True
    if not detail and set(state.storages) - state.scanned:
        state.follow()  # another replica may have done the first scan
    roots = {name: state.reach.fresh(name) for name in state.storages}
    for name, reach in roots.items():
        away = None if reach.reachable is not False else \
            f"the root cannot be reached (since {utc_text(reach.since_s)}): {reach.error}"
        if name not in state.scanned:
            detail[name] = "first scan not finished" + (f"; {away}" if away else "")
            unready = True
        elif away:
            detail[name] = away
            # Every replica reaches an object store alike: an outage that made each unready would leave the Service
            # with no endpoint (dashboard and jobs' reports included) while the catalog can still be served. A
            # directory root is this replica's own mount, and one that went away is a reason to send requests
            # elsewhere.
            unready = unready or not isinstance(state.storages[name], ObjectStore)
    status = "not ready" if unready else "degraded" if detail else "ok"
    body = ReadinessModel(status=status, detail=detail, loops=loop_models(state),
                          roots={name: root_model(reach) for name, reach in roots.items()})
    return JSONResponse(body.model_dump(), status_code=503 if unready else 200)


def root_model(reach: Reach) -> RootModel:
    return RootModel(reachable=reach.reachable, unreachable_since_s=reach.since_s, error=reach.error,
                     looked_s=reach.looked_s)


def utc_text(at: float | None) -> str:
    """``at`` in ISO 8601, UTC, to the second (``2026-12-01T08:15:02Z``)."""
    return "?" if at is None else datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


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
