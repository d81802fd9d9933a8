"""Warm-ups, from their coverage records, with what jobs have hit of them since."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request

from jaxcache.service.warmups import queries as coverage
from jaxcache.service.warmups.schemas import WarmupDetail, WarmupList, WarmupSummary
from jaxcache.service.web.deps import ERRORS, CacheName, ReadAuth, state_of, storage_of

router = APIRouter(tags=["warm-ups"], responses=ERRORS)


@router.get("/v1/caches/{cache}/warmups", response_model=WarmupList, operation_id="listWarmups")
def list_warmups(request: Request, cache: CacheName, _p: ReadAuth,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> WarmupList:
    """Warm-ups that filled this cache, newest first, with how many of their programs jobs hit since."""
    storage_of(request, cache)
    with state_of(request).catalog.reader() as conn:
        return WarmupList(warmups=[WarmupSummary(**w) for w in coverage.list_warmups(conn, cache, limit=limit)])


@router.get("/v1/caches/{cache}/warmups/{warmup_id}", response_model=WarmupDetail, operation_id="getWarmup")
def get_warmup(request: Request, cache: CacheName,
               warmup_id: Annotated[str, Path(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")],
               _p: ReadAuth) -> WarmupDetail:
    """One warm-up: topology, GPU model, fingerprint, and every program with the hits jobs reported since."""
    storage_of(request, cache)
    with state_of(request).catalog.reader() as conn:
        found = coverage.get_warmup(conn, cache, warmup_id)
    if found is None:
        raise HTTPException(404, f"no warm-up {warmup_id!r} recorded on {cache!r}")
    return WarmupDetail(**found)
