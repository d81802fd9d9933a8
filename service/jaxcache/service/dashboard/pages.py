"""The dashboard's pages that read: caches, overview, entries, an entry, jobs, a job, warm-ups; and signing in."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

from fastapi import HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.routing import APIRouter

from jaxcache.errors import InvalidInputError
from jaxcache.service.caches import summary
from jaxcache.service.dashboard import format as fmt
from jaxcache.service.dashboard import site
from jaxcache.service.dashboard.site import COOKIE, Dashboard, Viewer, credential, html_route, read_form, safe_next
from jaxcache.service.entries import queries
from jaxcache.service.integrity import queries as verdicts
from jaxcache.service.ops import loop_models
from jaxcache.service.reports.jobs import queries as runs
from jaxcache.service.warmups import queries as warmup_queries
from jaxcache.service.web.deps import check_key
from jaxcache.units import parse_bytes, parse_duration


def routes(dash: Dashboard) -> APIRouter:
    state = dash.state
    router = APIRouter(route_class=html_route(dash), include_in_schema=False)

    @router.get("/")
    def index(request: Request) -> Response:
        viewer = dash.viewer(request)
        return dash.render(request, "index.html", viewer=viewer, summaries=summary.caches(state),
                           loops=loop_models(state))

    @router.get("/login")
    def login_form(request: Request, next: str = "/", expired: str | None = None) -> Response:
        current = None
        if credential(request)[0] is not None:
            with contextlib.suppress(HTTPException, site.ToLogin):
                current = dash.viewer(request)
        message = "Your token is no longer accepted: sign in again." if expired else None
        return dash.render(request, "login.html", viewer=current, next_url=safe_next(next), error=message)

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = await read_form(request)
        if request.headers.get("sec-fetch-site") == "cross-site":
            raise HTTPException(403, "sign in from this site's own login form")
        token, next_url = form.get("token", "").strip(), safe_next(form.get("next"))
        try:
            state.auth.check_token(token or None, "read")
        except HTTPException as exc:
            message = ("Enter a token." if not token else "Unknown token." if exc.status_code == 401 else
                       f"{exc.detail}: the dashboard needs a read or admin token.")
            return dash.render(request, "login.html", status=exc.status_code if token else 400, viewer=None,
                               next_url=next_url, error=message)
        response = RedirectResponse(request.scope.get("root_path", "").rstrip("/") + next_url, 303)
        response.set_cookie(COOKIE, token, max_age=site.COOKIE_MAX_AGE_S, path="/", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        form = await read_form(request)
        token, source = credential(request)
        if source == "cookie":
            viewer = Viewer(who="", scope=None, token=token, source=source, can_admin=False)
            dash.check_form(request, viewer, form, "logout")
        response = RedirectResponse(request.scope.get("root_path", "").rstrip("/") + "/login", 303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @router.get("/caches/{cache}")
    def overview(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request, cache=cache)
        stats = summary.stats_of(state, cache)  # exactly what GET /v1/caches/{cache}/stats answers
        found = next(c for c in summary.caches(state) if c.name == cache)
        first = stats["first_created_s"]
        chart = fmt.growth_chart(stats["growth"], stats["size_bytes"],
                                 first_day=None if first is None else datetime.fromtimestamp(first, UTC).date())
        with state.catalog.reader() as conn:
            integrity = verdicts.summary(conn, cache, limit=20)  # what GET .../integrity answers
        return dash.render(request, "overview.html", viewer=viewer, cache=cache, section="overview", stats=stats,
                           summary=found, chart=chart, integrity=integrity, loops=loop_models(state),
                           causes=fmt.top_causes(stats["misses_by_cause"]), growth_label=fmt.growth_label(first))

    @router.get("/caches/{cache}/entries")
    def entries(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request, cache=cache)
        q = request.query_params
        form = {f: q.get(f, "").strip() for f in site.ENTRY_FILTERS}
        sort, order = q.get("sort"), q.get("order")
        sort = sort if sort in site.ENTRY_SORTS else "name"
        order = order if order in ("asc", "desc") else "asc"
        limit = int(q["limit"]) if q.get("limit", "").isdigit() and 1 <= int(q["limit"]) <= 1000 else 50
        cursor = q.get("cursor") or None
        error, rows, next_cursor, by_warmup = None, [], None, {}
        try:
            if form["status"] not in ("", "ok", "corrupt"):
                raise InvalidInputError("status: ok or corrupt")
            flt = queries.EntryFilter(
                function=form["function"] or None, status=form["status"] or None, job=form["job"] or None,
                jaxlib=form["jaxlib"] or None, topology=form["topology"] or None,
                min_size=parse_bytes(form["min_size"]) if form["min_size"] else None,
                max_size=parse_bytes(form["max_size"]) if form["max_size"] else None,
                unused_for_s=parse_duration(form["unused_for"]) if form["unused_for"] else None,
                older_than_s=parse_duration(form["older_than"]) if form["older_than"] else None)
            with state.catalog.reader() as conn:
                found, next_cursor = queries.list_entries(conn, cache, flt, sort=sort, order=order, limit=limit,
                                                          cursor=cursor)
                rows = [queries.page_entry(r, state.storages[cache].url) for r in found]
                by_warmup = warmup_queries.writer_warmups(
                    conn, cache, {r["key"]: r["first_writer"] for r in rows if r["first_writer"]})
        except InvalidInputError as exc:
            error = str(exc)
        params = {**form, "sort": sort, "order": order, "limit": limit}
        return dash.render(request, "entries.html", status=400 if error else 200, viewer=viewer, cache=cache,
                           section="entries", form=form, sort=sort, order=order, limit=limit, rows=rows,
                           next_cursor=next_cursor, cursor=cursor, params=params, error=error, by_warmup=by_warmup)

    @router.get("/caches/{cache}/entries/{key}")
    def entry(request: Request, cache: str, key: str) -> Response:
        viewer = dash.viewer(request, cache=cache)
        check_key(key)
        with state.catalog.reader() as conn:
            # What GET /v1/caches/{cache}/entries/{key} shows.
            found = queries.entry_detail(conn, cache, key, state.storages[cache].url)
            if found is None:
                raise HTTPException(404, f"no entry {key!r} in {cache!r} (a rescan picks up new entries)")
            entry, jobs, verdict, conflict = found
            writer = entry["first_writer"]
            by_warmup = None if writer is None else warmup_queries.writer_warmup(conn, cache, key, writer)
        return dash.render(request, "entry.html", viewer=viewer, cache=cache, section="entries",
                           e=entry, jobs=jobs, verdict=verdict, conflict=conflict, by_warmup=by_warmup)

    @router.get("/caches/{cache}/jobs")
    def jobs(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request, cache=cache)
        with state.catalog.reader() as conn:
            found = runs.jobs(conn, cache, limit=1000)
        return dash.render(request, "jobs.html", viewer=viewer, cache=cache, section="jobs", jobs=found)

    @router.get("/caches/{cache}/jobs/{job}")
    def job(request: Request, cache: str, job: str) -> Response:
        viewer = dash.viewer(request, cache=cache)
        with state.catalog.reader() as conn:
            found = runs.jobs(conn, cache, job=job, limit=1)
            if not found:
                raise HTTPException(404, f"no runs of job {job!r} reported on {cache!r}")
            missed = runs.job_misses(conn, cache, job, limit=1000)
            recent = runs.job_runs(conn, cache, job, limit=100)
        return dash.render(request, "job.html", viewer=viewer, cache=cache, section="jobs", j=found[0],
                           causes=fmt.by_cause(missed), recent=recent)

    @router.get("/caches/{cache}/warmups")
    def warmup_list(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request, cache=cache)
        with state.catalog.reader() as conn:
            found = warmup_queries.list_warmups(conn, cache, limit=1000)
        return dash.render(request, "warmups.html", viewer=viewer, cache=cache, section="warmups", warmups=found)

    @router.get("/caches/{cache}/warmups/{warmup_id}")
    def warmup_detail(request: Request, cache: str, warmup_id: str) -> Response:
        viewer = dash.viewer(request, cache=cache)
        with state.catalog.reader() as conn:
            found = warmup_queries.get_warmup(conn, cache, warmup_id)
        if found is None:
            raise HTTPException(404, f"no warm-up {warmup_id!r} ingested for {cache!r}")
        return dash.render(request, "warmup.html", viewer=viewer, cache=cache, section="warmups", w=found)

    return router
