"""Jobs, from their run records: totals per job, and one job's misses and recent processes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request

from jaxcache.service.reports import usage_queries
from jaxcache.service.reports.jobs_schemas import JobDetail, JobList, JobSummary
from jaxcache.service.web.deps import ERRORS, CacheName, ReadAuth, state_of, storage_of
from jaxcache.service.web.fields import TEXT

router = APIRouter(tags=["jobs"], responses=ERRORS)
JobName = Annotated[str, Path(max_length=200, pattern=TEXT)]


@router.get("/v1/caches/{cache}/jobs", response_model=JobList, operation_id="listJobs")
def list_jobs(request: Request, cache: CacheName, _p: ReadAuth,
              limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JobList:
    """Jobs that reported runs on this cache, newest first: hits, misses, hit rate, seconds spent and saved."""
    storage_of(request, cache)
    with state_of(request).catalog.reader() as conn:
        return JobList(jobs=[JobSummary(**j) for j in usage_queries.jobs(conn, cache, limit=limit)])


@router.get("/v1/caches/{cache}/jobs/{job}", response_model=JobDetail, operation_id="getJob")
def get_job(request: Request, cache: CacheName, job: JobName, _p: ReadAuth) -> JobDetail:
    """One job: its totals, the keys it had to compile (misses) and its recent processes."""
    storage_of(request, cache)
    with state_of(request).catalog.reader() as conn:
        found = usage_queries.jobs(conn, cache, job=job, limit=1)
        if not found:
            raise HTTPException(404, f"no runs of job {job!r} reported on {cache!r}")
        missed = usage_queries.job_misses(conn, cache, job, limit=1000)
        recent = usage_queries.job_runs(conn, cache, job, limit=100)
    return JobDetail(**found[0], missed=missed, recent_runs=recent)
