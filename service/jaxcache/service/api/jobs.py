"""Jobs, from their run records: totals per job, one job's misses and recent processes, and its working set."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request

from jaxcache.service.api.deps import ERRORS, CacheName, ReadAuth, state_of, storage_of
from jaxcache.service.api.schemas.fields import TEXT
from jaxcache.service.api.schemas.jobs import JobDetail, JobList, JobSummary, WorkingSet
from jaxcache.service.catalog import queries
from jaxcache.service.catalog.queries.working_set import working_set
from jaxcache.working_set import DEFAULT_DAYS, DEFAULT_RUNS, Wanted

router = APIRouter(tags=["jobs"], responses=ERRORS)
JobName = Annotated[str, Path(max_length=200, pattern=TEXT)]
#: A fingerprint field the caller knows (not given: taken from the newest matching run).
Known = Annotated[str | None, Query(max_length=1000, pattern=TEXT)]


@router.get("/v1/caches/{cache}/jobs", response_model=JobList, operation_id="listJobs")
def list_jobs(request: Request, cache: CacheName, _p: ReadAuth,
              limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JobList:
    """Jobs that reported runs on this cache, newest first: hits, misses, hit rate, seconds spent and saved."""
    storage_of(request, cache)
    with state_of(request).catalog.reader() as conn:
        return JobList(jobs=[JobSummary(**j) for j in queries.jobs(conn, cache, limit=limit)])


@router.get("/v1/caches/{cache}/jobs/{job}", response_model=JobDetail, operation_id="getJob")
def get_job(request: Request, cache: CacheName, job: JobName, _p: ReadAuth) -> JobDetail:
    """One job: its totals, the keys it had to compile (misses) and its recent processes."""
    storage_of(request, cache)
    with state_of(request).catalog.reader() as conn:
        found = queries.jobs(conn, cache, job=job, limit=1)
        if not found:
            raise HTTPException(404, f"no runs of job {job!r} reported on {cache!r}")
        missed = queries.job_misses(conn, cache, job, limit=1000)
        recent = queries.job_runs(conn, cache, job, limit=100)
    return JobDetail(**found[0], missed=missed, recent_runs=recent)


@router.get("/v1/caches/{cache}/jobs/{job}/working-set", response_model=WorkingSet, operation_id="getWorkingSet")
def get_working_set(request: Request, cache: CacheName, job: JobName, _p: ReadAuth, jaxlib: Known = None,
                    backend: Known = None, device_kind: Known = None,
                    device_count: Annotated[int | None, Query(ge=1, lt=2**53)] = None,
                    runs: Annotated[int, Query(ge=1, le=100)] = DEFAULT_RUNS,
                    days: Annotated[int, Query(ge=1, le=90)] = DEFAULT_DAYS) -> WorkingSet:
    """The keys the job is expected to need, as ``jaxcache.working_set.from_root`` reads them from the root: what
    process 0 of its newest ``runs`` runs within ``days`` days hit or wrote (never keys only compiled), in the
    order the newest run first used them, then what its warm-ups' coverage says is there. Runs and warm-ups must
    match the fingerprint fields given; those not given come from the newest matching run. No runs: empty keys."""
    storage_of(request, cache)
    wanted = Wanted(jaxlib=jaxlib, backend=backend, device_kind=device_kind, device_count=device_count)
    with state_of(request).catalog.reader() as conn:
        found = working_set(conn, cache, job, wanted, runs=runs, days=days)
    return WorkingSet(**found.to_builtins())
