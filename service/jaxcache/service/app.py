"""The FastAPI application: REST routes over the catalog, background rescans, auth, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated, Literal

import orjson
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy import delete, select, update

from jaxcache import entry as fmt
from jaxcache import records
from jaxcache.errors import InvalidInputError, JaxcacheError, PreconditionFailedError, StorageError
from jaxcache.service import dashboard
from jaxcache.service.auth import Authenticator, Principal
from jaxcache.service.catalog import queries
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.locks import LockBusyError
from jaxcache.service.catalog.models import CacheRow, EntryRow, PinRow
from jaxcache.service.ingestion import reports, warmups
from jaxcache.service.metrics import Metrics
from jaxcache.service.pagecache import PageCache, ServeCachedPages
from jaxcache.service.schemas import (
    CacheList,
    CacheSummary,
    EntryDetail,
    EntryJobModel,
    EntryPage,
    ErrorModel,
    Health,
    IntegritySummary,
    JobDetail,
    JobList,
    JobSummary,
    PinList,
    PinModel,
    PruneAudit,
    PruneAuditList,
    PruneRequest,
    PruneResponse,
    ReportErrorModel,
    ReportResult,
    RescanModel,
    RunRecordModel,
    StatsModel,
    VerifyRequest,
    VerifyResult,
    WarmupDetail,
    WarmupList,
    WarmupSummary,
)
from jaxcache.service.settings import ServiceSettings
from jaxcache.service.tasks import pruning, verification
from jaxcache.service.tasks.pruning import PruneInProgressError, PruneLocks
from jaxcache.service.tasks.rescan import RescanResult, rescan
from jaxcache.storage import Storage, open_storage
from jaxcache.units import parse_duration

log = logging.getLogger("jaxcache.service")

_ERRORS = {
    400: {"model": ErrorModel, "description": "malformed input"},
    401: {"model": ErrorModel, "description": "no or unknown bearer token"},
    403: {"model": ErrorModel, "description": "the token lacks the scope"},
    404: {"model": ErrorModel, "description": "no such cache or entry"},
}
_MAX_PATTERN = 256
_STATS_TTL_S = 60.0
_DAY_S = 86400.0
#: How long POST /v1/caches/{cache}/rescan waits for a rescan another replica is running before it answers 409.
_RESCAN_WAIT_S = 60.0
REPORTS_PATH = "/v1/reports"


class State:
    """Everything the routes share, built once per app."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.auth = Authenticator(settings)
        self.catalog = Catalog(settings.db)
        self.metrics = Metrics()
        self.storages: dict[str, Storage] = {name: open_storage(url) for name, url in settings.caches.items()}
        self.prune_locks = PruneLocks(self.catalog.locks)
        self.pages = PageCache(settings.page_cache_s)
        self._stats: dict[str, tuple[float, dict]] = {}
        self._usage: dict[str, tuple[float, dict]] = {}
        self._refreshing: set[tuple[str, str]] = set()  # (what, cache) being recomputed in a thread
        self.roots = reports.roots_by_dir({name: storage.url for name, storage in self.storages.items()})
        self.scanned: set[str] = set()
        self._rounds_done: set[str] = set()  # caches this process has rescanned in a background round
        self.background_rounds = 0  # rounds of background rescans finished (or failed) since start
        with self.catalog.session() as s:
            for name in settings.caches:
                # An upsert: replicas starting together register the same caches.
                url = self.storages[name].url
                s.execute(self.catalog.insert(CacheRow).values(name=name, url=url)
                          .on_conflict_do_update(index_elements=["name"], set_={"url": url}))
        self.follow()

    def follow(self, name: str | None = None) -> None:
        """Catch up with what other replicas did to the catalog: caches they have scanned count as scanned here
        (ready), and cached statistics and gauges of ``name`` are refreshed."""
        with self.catalog.session() as s:
            for row in s.scalars(select(CacheRow).where(CacheRow.name.in_(list(self.settings.caches)))):
                if row.last_scan_s is not None:
                    self.scanned.add(row.name)  # the catalog survived a restart, or another replica scanned it
        if name is not None:
            self.changed(name)
            self._usage.pop(name, None)

    def rescan(self, name: str, *, wait_s: float | None = None) -> RescanResult:
        """Rescan one cache (one rescan of a cache at a time in every replica: waits at most ``wait_s`` seconds
        for one running elsewhere, then raises LockBusyError), recording metrics and errors."""
        try:
            result = rescan(self.catalog, name, self.storages[name], wait_s=wait_s)
        except LockBusyError:
            raise
        except JaxcacheError as exc:
            with self.catalog.session() as s:  # a write without a read first: see rescan.py
                s.execute(update(CacheRow).where(CacheRow.name == name).values(last_scan_error=str(exc)[:2000]))
            raise
        self.scanned.add(name)
        self.metrics.scan_seconds.labels(name).observe(result.seconds)
        if result.records_ingested:
            self.metrics.reports_ingested.labels(name, reports.STORAGE).inc(result.records_ingested)
            self._usage.pop(name, None)
            self.pages.invalidate(name)  # hits, last use and first writers of listed entries moved
        if result.records_malformed:
            self.metrics.reports_malformed.labels(reports.STORAGE).inc(result.records_malformed)
        if result.added or result.removed or result.updated or name not in self._stats:
            self.changed(name)
            self.stats(name)  # computed here, in the scan thread, so requests find it ready
        return result

    def changed(self, name: str) -> None:
        """Something in ``name`` changed (rescan, prune, delete): cached statistics and pages are stale."""
        self.pages.invalidate(name)
        self._stats.pop(name, None)
        self._usage.pop(name, None)  # seconds saved by function count the entries present
        self._refresh_gauges(name)

    def stats(self, name: str) -> dict:
        """Statistics of one cache, recomputed after a change or once a minute (growth windows move)."""
        return {**self._fresh(self._stats, name, self._compute_stats), **self.usage(name)}

    def usage(self, name: str) -> dict:
        """Hit rate and seconds saved over the last 24 h and 7 d, and seconds saved by function; cached apart from
        the entry statistics, since reports arrive far more often than entries change."""
        return self._fresh(self._usage, name, self._compute_usage)

    def _fresh(self, cached: dict[str, tuple[float, dict]], name: str, compute) -> dict:
        # After a change the value is gone and computed now (a second at 100k entries). Once it is merely older
        # than the TTL, the old value is answered while one thread computes the new one: no request waits.
        found = cached.get(name)
        if found is None:
            result = compute(name)
            cached[name] = (time.monotonic(), result)
            return result
        job = (compute.__name__, name)
        if time.monotonic() - found[0] >= _STATS_TTL_S and job not in self._refreshing:
            self._refreshing.add(job)
            generation = self.pages.generation(name)  # moves with every change of the cache (see changed())

            def refresh() -> None:
                try:
                    result = compute(name)
                    if self.pages.generation(name) == generation:  # else a change made it stale meanwhile
                        cached[name] = (time.monotonic(), result)
                except Exception:  # the catalog went away: the next request tries again
                    log.exception("refreshing statistics of %s failed", name)
                finally:
                    self._refreshing.discard(job)

            threading.Thread(target=refresh, name="jaxcache-stats", daemon=True).start()
        return found[1]

    def _compute_stats(self, name: str) -> dict:
        with self.catalog.session() as s:
            return queries.stats(s, name)

    def _compute_usage(self, name: str) -> dict:
        now = time.time()
        with self.catalog.reader() as conn:
            return {"last_24h": queries.usage_window(conn, name, since=now - _DAY_S),
                    "last_7d": queries.usage_window(conn, name, since=now - 7 * _DAY_S),
                    "by_function_saved": queries.saved_by_function(conn, name)}

    def ingest(self, name: str, record: records.RunRecord) -> reports.IngestResult:
        """Ingest one POSTed run record into ``name``."""
        result = reports.ingest(self.catalog, name, record, source=reports.REPORT)
        if not result.stale:
            self.metrics.reports_ingested.labels(name, reports.REPORT).inc()
            self._usage.pop(name, None)
            self.pages.invalidate(name)  # hits and last use of listed entries moved
        return result

    def caches(self) -> list[CacheSummary]:
        """Every configured cache with its size and last scan."""
        out = []
        with self.catalog.session() as s:
            for name in self.settings.caches:
                row = s.get(CacheRow, name)
                count, size = queries.cache_totals(s, name)
                out.append(CacheSummary(
                    name=name, url=self.storages[name].url, entries=count, size_bytes=size,
                    last_scan_s=row.last_scan_s if row else None,
                    last_scan_seconds=row.last_scan_seconds if row else None,
                    last_scan_error=row.last_scan_error if row else None,
                ))
        return out

    def prune(self, name: str, body: PruneRequest, *, who: str) -> pruning.Outcome:
        """Plan (or apply, when ``body.dry_run`` is false: the caller checked the admin scope) a prune of ``name``.
        Raises InvalidInputError for a bad policy, PruneInProgressError while another prune of ``name`` runs."""
        policy, policy_json = pruning.policy_of(body)
        outcome = pruning.run_prune(self.catalog, name, self.storages[name], policy, dry_run=body.dry_run, who=who,
                                    policy_json=policy_json, lock=self.prune_locks.get(name))
        if outcome.result is not None:
            self.metrics.prune_deleted.labels(name).inc(outcome.result.deleted)
            self.metrics.prune_bytes.labels(name).inc(outcome.result.bytes_freed)
            self.changed(name)
        return outcome

    def _refresh_gauges(self, name: str) -> None:
        with self.catalog.session() as s:
            count, size = queries.cache_totals(s, name)
        self.metrics.entries.labels(name).set(count)
        self.metrics.bytes.labels(name).set(size)

    def verify(self, name: str, *, max_entries: int | None = None, recheck_all: bool = False,
               stop: threading.Event | None = None, throttled: bool = False) -> verification.VerifyPass:
        """One integrity pass over ``name`` (only what needs it unless ``recheck_all``)."""
        if name not in self.scanned:
            self.rescan(name)
        result = verification.run_pass(
            self.catalog, name, self.storages[name], min_age_s=self.settings.verify_min_age_s,
            max_entries=max_entries, recheck_all=recheck_all, stop=stop,
            bytes_per_s=self.settings.verify_bytes_per_s if throttled else None,
            cpu_share=self.settings.verify_cpu_share if throttled else None,
        )
        self._refresh_integrity(name)
        return result

    def verify_all(self, stop: threading.Event) -> None:
        for name in self.settings.caches:
            if stop.is_set():
                return
            try:
                self.verify(name, stop=stop, throttled=True)
            except JaxcacheError as exc:
                log.warning("integrity pass over %s failed: %s", name, exc)

    def _refresh_integrity(self, name: str) -> None:
        with self.catalog.reader() as conn:
            counts = verification.summary(conn, name, limit=0)["counts"]
        for cls, n in counts.items():
            self.metrics.integrity.labels(name, cls).set(n)

    def rescan_all(self) -> None:
        """One round of background rescans. With several replicas on one catalog, a cache is skipped when another
        replica is rescanning it or finished a rescan less than half a period ago: each replica does not list the
        whole bucket every period."""
        now = time.time()
        with self.catalog.session() as s:
            last = {r.name: r.last_scan_s for r in s.scalars(select(CacheRow))}
        for name in self.settings.caches:
            at = last.get(name)
            # A process's first round always rescans: records and entries written while it was down (or
            # since the last replica's scan) must not wait a whole period.
            if (at is not None and name in self._rounds_done and 0 <= now - at < self.settings.rescan_s / 2):
                log.debug("rescan of %s skipped: scanned %.0f s ago (by another replica)", name, now - at)
                self.follow(name)
                continue
            try:
                self.rescan(name, wait_s=0)
                self._rounds_done.add(name)
            except LockBusyError:
                log.info("rescan of %s skipped: another replica is running one", name)
                self.follow(name)
            except JaxcacheError as exc:
                log.warning("rescan of %s failed: %s", name, exc)
            except Exception:  # the database went away (a fail-over): the next round tries again
                log.exception("rescan of %s failed", name)


class LimitsAndMetrics:
    """Rejects oversized bodies (413) and records latency by route template.

    A plain ASGI middleware: Starlette's BaseHTTPMiddleware costs about a millisecond per request.
    """

    def __init__(self, app, *, metrics: Metrics, max_body_bytes: int, max_report_bytes: int) -> None:
        self.app, self.metrics, self.max_body_bytes = app, metrics, max_body_bytes
        self.max_report_bytes = max_report_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # A run record lists every key a process touched: far bigger than any other body.
        limit = self.max_report_bytes if scope["path"] == REPORTS_PATH else self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > limit):
                response = JSONResponse({"detail": f"request body over {limit} bytes"}, 413)
                await response(scope, receive, send)
                return
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:  # chunked bodies carry no content-length
                raise HTTPException(413, f"request body over {limit} bytes")
            return message

        started = time.perf_counter()
        try:
            await self.app(scope, limited_receive, send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or scope.get("jaxcache.route", "unmatched")
            self.metrics.request_seconds.labels(template, scope["method"]).observe(time.perf_counter() - started)


def _state(request: Request) -> State:
    return request.app.state.jaxcache


def _scope(scope: str):
    async def check(request: Request) -> Principal:  # async: no thread hop for a hash and a compare
        return _state(request).auth.check(request, scope)

    return Depends(check)


ReadAuth = Annotated[Principal, _scope("read")]
ReportAuth = Annotated[Principal, _scope("report")]
AdminAuth = Annotated[Principal, _scope("admin")]
CacheName = Annotated[str, Path(description="a configured cache name", max_length=64, examples=["prod"])]
EntryKey = Annotated[str, Path(description="the entry key: <function>-<64 hex>", max_length=600)]


def _storage(request: Request, cache: str) -> Storage:
    storage = _state(request).storages.get(cache)
    if storage is None:
        raise HTTPException(404, f"no cache named {cache!r}: GET /v1/caches lists them")
    return storage


def _check_key(key: str) -> str:
    if not fmt.is_valid_key(key):
        raise HTTPException(400, "malformed key: expected <function>-<64 lower-case hex>, as JAX names entries")
    return key


def _duration(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except InvalidInputError as exc:
        raise HTTPException(400, f"{name}: {exc}") from None


def _register_record_schema(app: FastAPI) -> None:
    """Document the run record as the body of POST /v1/reports. The route reads the raw body (records.parse is
    the one validator, and auth must come before parsing), so FastAPI cannot see the model by itself."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            body = RunRecordModel.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, sub in body.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components["RunRecordModel"] = body
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """Build the service. Raises :class:`JaxcacheError` for unusable settings (bad URL, missing root)."""
    settings = settings or ServiceSettings()
    state = State(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()

        first_round = asyncio.Event()

        async def loop() -> None:
            while not stop.is_set():
                try:
                    await run_in_threadpool(state.rescan_all)
                except Exception:  # the catalog is unreachable (a database fail-over): try again next round
                    log.exception("background rescans failed")
                state.background_rounds += 1
                first_round.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=settings.rescan_s)

        stop_verify = threading.Event()

        async def verify_loop() -> None:
            # Separate from rescans: a slow, throttled pass must not delay them. It starts after the first round,
            # which has scanned every cache: started beside it, it found the caches not yet scanned and queued a
            # second whole rescan of each behind the first.
            await first_round.wait()
            while not stop.is_set():
                await run_in_threadpool(state.verify_all, stop_verify)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=settings.rescan_s)

        task = asyncio.create_task(loop())
        verify_task = asyncio.create_task(verify_loop())
        try:
            yield
        finally:
            stop.set()
            stop_verify.set()
            task.cancel()
            verify_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            state.catalog.dispose()

    app = FastAPI(
        title="jaxcache",
        version="1",
        summary="Catalog, statistics and policy-driven pruning of JAX persistent compilation caches.",
        lifespan=lifespan,
    )
    app.state.jaxcache = state

    # Inside LimitsAndMetrics, which times the pages it answers too.
    app.add_middleware(ServeCachedPages, pages=state.pages, auth=state.auth)
    app.add_middleware(LimitsAndMetrics, metrics=state.metrics, max_body_bytes=settings.max_body_bytes,
                       max_report_bytes=settings.max_report_bytes)
    _register_record_schema(app)

    @app.exception_handler(JaxcacheError)
    async def jaxcache_error(_request: Request, exc: JaxcacheError) -> JSONResponse:
        # The one place our errors become HTTP statuses.
        if isinstance(exc, InvalidInputError):
            status = 400
        elif isinstance(exc, PreconditionFailedError | LockBusyError):
            status = 409
        elif isinstance(exc, StorageError):
            status = 502
        else:
            status = 500
        return JSONResponse({"detail": str(exc)}, status_code=status)

    dashboard.install(app, state)  # the web dashboard at / (the API's docs stay at /docs)

    @app.get("/healthz", response_model=Health, operation_id="healthz", tags=["ops"])
    async def healthz() -> Health:
        """The process is up."""
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, operation_id="readyz", tags=["ops"],
             responses={503: {"model": Health, "description": "not ready"}})
    def readyz() -> Response:
        """The catalog answers, every cache has been scanned once, and every storage is reachable."""
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
        ok = not detail
        body = Health(status="ok" if ok else "not ready", detail=detail)
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @app.get("/metrics", operation_id="metrics", tags=["ops"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
    def metrics() -> Response:
        """Prometheus metrics: entries, bytes, scan seconds, prune deletions and bytes, request latency."""
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/caches", response_model=CacheList, operation_id="listCaches", tags=["caches"], responses=_ERRORS)
    def list_caches(_p: ReadAuth) -> CacheList:
        """Every configured cache with its size and last scan."""
        return CacheList(caches=state.caches())

    @app.get("/v1/caches/{cache}/entries", response_model=EntryPage, operation_id="listEntries", tags=["entries"],
             responses=_ERRORS)
    async def list_entries(
        request: Request, cache: CacheName, _p: ReadAuth,
        function: Annotated[str | None, Query(max_length=256, description="glob over function names")] = None,
        min_size: Annotated[int | None, Query(ge=0, le=2**62)] = None,
        max_size: Annotated[int | None, Query(ge=0, le=2**62)] = None,
        unused_for: Annotated[str | None, Query(max_length=32, description="e.g. 14d", examples=["14d"])] = None,
        older_than: Annotated[str | None, Query(max_length=32, examples=["30d"])] = None,
        status: Literal["ok", "corrupt"] | None = None,
        job: Annotated[str | None, Query(max_length=200, description="entries this job wrote or hit")] = None,
        jaxlib: Annotated[str | None, Query(max_length=200, description="the first writer's jaxlib version",
                                            examples=["0.12.0"])] = None,
        topology: Annotated[str | None, Query(max_length=200, description="the first writer's topology",
                                              examples=["4x8x1"])] = None,
        sort: Literal["size", "compile", "last_used", "created", "name", "hits"] = "name",
        order: Literal["asc", "desc"] = "asc",
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        cursor: Annotated[str | None, Query(max_length=2048)] = None,
    ) -> Response:
        """A page of entries, filtered and sorted; follow `next_cursor` for the rest."""
        _storage(request, cache)
        generation = state.pages.generation(cache)
        flt = queries.EntryFilter(
            function=function, min_size=min_size, max_size=max_size,
            unused_for_s=_duration(unused_for, "unused_for"), older_than_s=_duration(older_than, "older_than"),
            status=status, job=job, jaxlib=jaxlib, topology=topology,
        )
        with state.catalog.reader() as conn:
            rows, nxt = queries.list_entries(conn, cache, flt, sort=sort, order=order, limit=limit, cursor=cursor)
        # The hot route: rows become JSON directly (the same fields as EntryModel, which documents them);
        # validating 100 models per request would cost more than the query, and orjson is 20x the json module.
        body = orjson.dumps({"entries": [queries.page_entry(r) for r in rows], "next_cursor": nxt})
        state.pages.put(cache, request.scope["query_string"], body, generation)
        return Response(body, media_type="application/json")

    @app.get("/v1/caches/{cache}/entries/{key}", response_model=EntryDetail, operation_id="getEntry",
             tags=["entries"], responses=_ERRORS)
    def get_entry(request: Request, cache: CacheName, key: EntryKey, _p: ReadAuth) -> EntryDetail:
        """One entry, with every job that reported it."""
        _storage(request, cache)
        _check_key(key)
        with state.catalog.reader() as conn:
            found = queries.entry_detail(conn, cache, key)
        if found is None:
            raise HTTPException(404, f"no entry {key!r} in {cache!r} (a rescan picks up new entries)")
        entry, jobs, verdict = found
        checked = {} if verdict is None else dict(
            integrity=verdict.classification, integrity_reasons=verdict.reasons, sha256=verdict.sha256,
            attested_by=verdict.attested_by)
        return EntryDetail(**entry, jobs=[EntryJobModel(**j) for j in jobs], **checked)

    @app.delete("/v1/caches/{cache}/entries/{key}", status_code=204, operation_id="deleteEntry", tags=["entries"],
                responses=_ERRORS)
    def delete_entry(request: Request, cache: CacheName, key: EntryKey, _p: AdminAuth) -> Response:
        """Delete one entry (its -cache, then its -atime). Jobs that need it recompile and write it again."""
        storage = _storage(request, cache)
        _check_key(key)
        with state.catalog.session() as s:
            row = s.get(EntryRow, (cache, key, "entry"))
            generation = row.generation if row else None
        existed = storage.delete(fmt.cache_name(key), if_generation=generation)
        storage.delete(fmt.atime_name(key))
        with state.catalog.session() as s:
            s.execute(delete(EntryRow).where(EntryRow.cache == cache, EntryRow.key == key))
        state.changed(cache)
        if not existed and row is None:
            raise HTTPException(404, f"no entry {key!r} in {cache!r}")
        return Response(status_code=204)

    @app.get("/v1/caches/{cache}/stats", response_model=StatsModel, operation_id="getStats", tags=["caches"],
             responses=_ERRORS)
    def get_stats(request: Request, cache: CacheName, _p: ReadAuth) -> StatsModel:
        """Totals, by function, by compression, growth per day, corrupt entries and orphans; hit rate and seconds
        saved over the last 24 h and 7 d (processes whose run records were updated within the window)."""
        _storage(request, cache)
        return StatsModel(**state.stats(cache))

    @app.post("/v1/caches/{cache}/prune", response_model=PruneResponse, operation_id="prune", tags=["prune"],
              responses={**_ERRORS, 409: {"model": ErrorModel,
                                          "description": "a prune of this cache is running (on any replica)"}})
    async def post_prune(request: Request, cache: CacheName, body: PruneRequest) -> PruneResponse:
        """Plan a prune (default: dry run) or, with `dry_run: false` and an admin token, apply it."""
        principal = state.auth.check(request, "read" if body.dry_run else "admin")
        _storage(request, cache)
        try:
            outcome = await run_in_threadpool(state.prune, cache, body, who=principal.who)
        except PruneInProgressError:
            raise HTTPException(409, f"a prune of {cache!r} is already running (on this or another replica of the "
                                     "service); try again when it ends") from None
        return pruning.response(outcome, dry_run=body.dry_run)

    @app.get("/v1/caches/{cache}/prunes", response_model=PruneAuditList, operation_id="listPrunes", tags=["prune"],
             responses=_ERRORS)
    def list_prunes(request: Request, cache: CacheName, _p: ReadAuth,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> PruneAuditList:
        """Applied prunes, newest first: who, when, policy, counts, bytes."""
        _storage(request, cache)
        with state.catalog.reader() as conn:
            return PruneAuditList(prunes=[PruneAudit(**r) for r in queries.prunes(conn, cache, limit=limit)])

    @app.get("/v1/caches/{cache}/pins", response_model=PinList, operation_id="listPins", tags=["prune"],
             responses=_ERRORS)
    def list_pins(request: Request, cache: CacheName, _p: ReadAuth) -> PinList:
        """Keys and globs that prunes never delete."""
        _storage(request, cache)
        with state.catalog.session() as s:
            rows = s.scalars(select(PinRow).where(PinRow.cache == cache).order_by(PinRow.pattern))
            return PinList(pins=[PinModel(pattern=r.pattern, created_s=r.created_s, created_by=r.created_by)
                                 for r in rows])

    def _check_pattern(pattern: str) -> str:
        if not pattern or len(pattern) > _MAX_PATTERN or "/" in pattern or "\x00" in pattern:
            raise HTTPException(400, "a pin is an entry key or a glob over keys and function names, "
                                     f"1-{_MAX_PATTERN} characters, without '/'")
        return pattern

    @app.put("/v1/caches/{cache}/pins/{pattern}", response_model=PinModel, operation_id="putPin", tags=["prune"],
             responses=_ERRORS)
    def put_pin(request: Request, cache: CacheName, pattern: str, p: AdminAuth) -> PinModel:
        """Protect entries matching `pattern` (a key, or a glob such as `jit_train*`) from every prune."""
        _storage(request, cache)
        _check_pattern(pattern)
        with state.catalog.session() as s:
            # An upsert that keeps the first pin: two replicas may get the same PUT.
            s.execute(state.catalog.insert(PinRow)
                      .values(cache=cache, pattern=pattern, created_s=time.time(), created_by=p.who)
                      .on_conflict_do_nothing(index_elements=["cache", "pattern"]))
            row = s.get(PinRow, (cache, pattern))
            return PinModel(pattern=row.pattern, created_s=row.created_s, created_by=row.created_by)

    @app.delete("/v1/caches/{cache}/pins/{pattern}", status_code=204, operation_id="deletePin", tags=["prune"],
                responses=_ERRORS)
    def delete_pin(request: Request, cache: CacheName, pattern: str, _p: AdminAuth) -> Response:
        """Remove a pin."""
        _storage(request, cache)
        _check_pattern(pattern)
        with state.catalog.session() as s:  # a write without a read first: see rescan.py
            gone = s.execute(delete(PinRow).where(PinRow.cache == cache, PinRow.pattern == pattern)).rowcount
        if not gone:
            raise HTTPException(404, f"no pin {pattern!r} on {cache!r}")
        return Response(status_code=204)

    @app.post("/v1/caches/{cache}/rescan", response_model=RescanModel, operation_id="rescan", tags=["caches"],
              responses={**_ERRORS, 409: {"model": ErrorModel, "description": "another replica has been rescanning "
                                          "this cache for a minute: try again when it ends"}})
    async def post_rescan(request: Request, cache: CacheName, _p: AdminAuth) -> RescanModel:
        """Rescan one cache now (background rescans run every JAXCACHE_RESCAN_S seconds): entries, and the run
        records under .jaxcache/runs/ that are new or changed."""
        _storage(request, cache)
        r = await run_in_threadpool(state.rescan, cache, wait_s=_RESCAN_WAIT_S)
        return RescanModel(cache=r.cache, added=r.added, removed=r.removed, updated=r.updated, entries=r.entries,
                           seconds=r.seconds, records_ingested=r.records_ingested,
                           records_malformed=r.records_malformed, warmups_ingested=r.warmups_ingested)

    @app.get("/v1/caches/{cache}/jobs", response_model=JobList, operation_id="listJobs", tags=["jobs"],
             responses=_ERRORS)
    def list_jobs(request: Request, cache: CacheName, _p: ReadAuth,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JobList:
        """Jobs that reported runs on this cache, newest first: hits, misses, hit rate, seconds spent and saved."""
        _storage(request, cache)
        with state.catalog.reader() as conn:
            return JobList(jobs=[JobSummary(**j) for j in queries.jobs(conn, cache, limit=limit)])

    @app.get("/v1/caches/{cache}/jobs/{job}", response_model=JobDetail, operation_id="getJob", tags=["jobs"],
             responses=_ERRORS)
    def get_job(request: Request, cache: CacheName, job: Annotated[str, Path(max_length=200)],
                _p: ReadAuth) -> JobDetail:
        """One job: its totals, the keys it had to compile (misses) and its recent processes."""
        _storage(request, cache)
        with state.catalog.reader() as conn:
            found = queries.jobs(conn, cache, job=job, limit=1)
            if not found:
                raise HTTPException(404, f"no runs of job {job!r} reported on {cache!r}")
            missed = queries.job_misses(conn, cache, job, limit=1000)
            recent = queries.job_runs(conn, cache, job, limit=100)
        return JobDetail(**found[0], missed=missed, recent_runs=recent)

    @app.get("/v1/caches/{cache}/warmups", response_model=WarmupList, operation_id="listWarmups",
             tags=["warm-ups"], responses=_ERRORS)
    def list_warmups(request: Request, cache: CacheName, _p: ReadAuth,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> WarmupList:
        """Warm-ups that filled this cache (from .jaxcache/warmups/ coverage records), newest first, each with how
        many of its programs jobs have hit since."""
        _storage(request, cache)
        with state.catalog.reader() as conn:
            return WarmupList(warmups=[WarmupSummary(**w) for w in warmups.list_warmups(conn, cache, limit=limit)])

    @app.get("/v1/caches/{cache}/warmups/{warmup_id}", response_model=WarmupDetail, operation_id="getWarmup",
             tags=["warm-ups"], responses=_ERRORS)
    def get_warmup(request: Request, cache: CacheName,
                   warmup_id: Annotated[str, Path(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")],
                   _p: ReadAuth) -> WarmupDetail:
        """One warm-up: topology, GPU model, fingerprint, and every program with the hits jobs reported since."""
        _storage(request, cache)
        with state.catalog.reader() as conn:
            found = warmups.get_warmup(conn, cache, warmup_id)
        if found is None:
            raise HTTPException(404, f"no warm-up {warmup_id!r} recorded on {cache!r}")
        return WarmupDetail(**found)

    @app.post("/v1/caches/{cache}/verify", response_model=VerifyResult, operation_id="verify", tags=["integrity"],
              responses=_ERRORS)
    async def post_verify(request: Request, cache: CacheName, _p: AdminAuth,
                          body: VerifyRequest | None = None) -> VerifyResult:
        """Verify entries now, unthrottled: new, changed and pending ones (or all with `recheck_all`). Each is
        read, compared with its writer's digest and its embedded program name, and classified ok, tampered,
        mismatched, corrupt, pending (younger than JAXCACHE_VERIFY_MIN_AGE_S) or unattested. The background pass
        does the same, throttled to JAXCACHE_VERIFY_BYTES_PER_S."""
        _storage(request, cache)
        body = body or VerifyRequest()
        r = await run_in_threadpool(partial(state.verify, cache, max_entries=body.max_entries,
                                            recheck_all=body.recheck_all))
        return VerifyResult(cache=r.cache, checked=r.checked, bytes_read=r.bytes_read, counts=r.counts,
                            remaining=r.remaining, seconds=r.seconds)

    @app.get("/v1/caches/{cache}/integrity", response_model=IntegritySummary, operation_id="getIntegrity",
             tags=["integrity"], responses=_ERRORS)
    def get_integrity(request: Request, cache: CacheName, _p: ReadAuth) -> IntegritySummary:
        """Integrity of the cache's entries by class, and every tampered, mismatched, corrupt or pending one."""
        _storage(request, cache)
        with state.catalog.reader() as conn:
            return IntegritySummary(**verification.summary(conn, cache))

    @app.get("/v1/integrity", response_model=IntegritySummary, operation_id="getIntegrityByDir",
             tags=["integrity"], responses={**_ERRORS, 422: {"model": ErrorModel,
                                                             "description": "cache_dir names no configured cache"}})
    def get_integrity_by_dir(
        _p: Annotated[Principal, _scope("read or report")],
        cache_dir: Annotated[str, Query(max_length=1024, description="a cache root as a job spells it")],
    ) -> IntegritySummary:
        """The same summary, for the cache whose root is `cache_dir`: what `enable_cache(verify="attested")` asks
        before a job starts. A `report` token (the job's) is enough."""
        try:
            name = reports.cache_for_dir(cache_dir, state.roots)
        except InvalidInputError as exc:
            raise HTTPException(422, str(exc)) from None
        with state.catalog.reader() as conn:
            return IntegritySummary(**verification.summary(conn, name))

    @app.post(
        REPORTS_PATH, response_model=ReportResult, operation_id="ingestReport", tags=["reports"],
        responses={
            **_ERRORS,
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
        if cache is not None:
            _storage(request, cache)
        body = await request.body()
        try:
            record = records.parse(body)
            name = cache if cache is not None else reports.cache_for(record, state.roots)
        except InvalidInputError as exc:
            state.metrics.reports_malformed.labels(reports.REPORT).inc()
            raise HTTPException(422, str(exc)) from None
        try:
            r = await run_in_threadpool(state.ingest, name, record)
        except InvalidInputError as exc:
            state.metrics.reports_malformed.labels(reports.REPORT).inc()
            raise HTTPException(422, str(exc)) from None
        return ReportResult(cache=r.cache, run_id=r.run_id, process_index=r.process_index,
                            runs=0 if r.stale else 1, keys=r.keys, stale=r.stale)

    return app

