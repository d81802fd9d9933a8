"""Jobs, from their run records: totals per job, one job's misses and recent processes, and its working set by
cache name or by the root a job names (the client's prefetch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request

from jaxcache.service.reports.jobs import queries
from jaxcache.service.reports.jobs.schemas import JobDetail, JobList, JobSummary, WorkingSet
from jaxcache.service.web.deps import (
    BY_DIR_ERRORS,
    ERRORS,
    CacheDir,
    CacheName,
    ReadAuth,
    ReadOrReportAuth,
    cache_of_dir,
    state_of,
    storage_of,
)
from jaxcache.service.web.fields import TEXT
from jaxcache.working_set import DEFAULT_DAYS, DEFAULT_RUNS, Wanted

router = APIRouter(tags=["jobs"], responses=ERRORS)
JobName = Annotated[str, Path(max_length=200, pattern=TEXT)]


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


#: A fingerprint field the caller knows (not given: taken from the newest matching run).
Known = Annotated[str | None, Query(max_length=1000, pattern=TEXT)]


@dataclass(frozen=True, slots=True)
class Asked:
    wanted: Wanted
    runs: int
    days: int


def _asked(jaxlib: Known = None, backend: Known = None, device_kind: Known = None,
           device_count: Annotated[int | None, Query(ge=1, lt=2**53)] = None,
           runs: Annotated[int, Query(ge=1, le=100, description="at most this many runs")] = DEFAULT_RUNS,
           days: Annotated[int, Query(ge=1, le=90, description="runs started within this many UTC days, "
                                                               "warm-ups finished within as many")] = DEFAULT_DAYS,
           ) -> Asked:
    return Asked(Wanted(jaxlib=jaxlib, backend=backend, device_kind=device_kind, device_count=device_count),
                 runs, days)


AskedSet = Annotated[Asked, Depends(_asked)]


def _answer(request: Request, cache: str, job: str, asked: Asked) -> WorkingSet:
    with state_of(request).catalog.reader() as conn:
        found = queries.working_set(conn, cache, job, asked.wanted, runs=asked.runs, days=asked.days)
    return WorkingSet(**found.to_builtins())


@router.get("/v1/caches/{cache}/jobs/{job}/working-set", response_model=WorkingSet, operation_id="getWorkingSet")
def get_working_set(request: Request, cache: CacheName, job: JobName, _p: ReadAuth, asked: AskedSet) -> WorkingSet:
    """The keys the job's newest matching runs hit or wrote, in order of first use, then its warm-ups' keys."""
    storage_of(request, cache)
    return _answer(request, cache, job, asked)


@router.get("/v1/working-set", response_model=WorkingSet, operation_id="getWorkingSetByDir",
            responses=BY_DIR_ERRORS)
def get_working_set_by_dir(request: Request, _p: ReadOrReportAuth, cache_dir: CacheDir,
                           job: Annotated[str, Query(max_length=200, pattern=TEXT)],
                           asked: AskedSet) -> WorkingSet:
    """The same set by root, as the client's prefetch asks it; a `report` token is enough."""
    return _answer(request, cache_of_dir(request, cache_dir, "jobs/JOB/working-set"), job, asked)
