"""The web dashboard: server-rendered pages over the catalog, with the same auth as the API.

Every figure comes from the query functions the API's routes call (``State.stats``, ``queries.list_entries``,
``queries.jobs`` ...), so a page and the API's JSON always agree. Pages work without JavaScript; the one script
only adds conveniences (the apply button waits for the confirmation; a copy button for keys).

Auth: the token comes from the ``Authorization: Bearer`` header, as for the API, or from the HttpOnly,
SameSite=Strict cookie the login form sets. Reads are open without a token exactly when the API's are (loopback,
no tokens configured). Forms that change something carry a per-form token derived from the credential (an HMAC
keyed by the token itself), so another site cannot post them even where SameSite is not honoured.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute, APIRouter
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pydantic import ValidationError

from jaxcache import entry as entry_fmt
from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.service.catalog import queries
from jaxcache.service.dashboard import format as fmt
from jaxcache.service.dashboard import warmups
from jaxcache.service.schemas import PruneRequest
from jaxcache.service.tasks import pruning, verification
from jaxcache.service.tasks.pruning import PruneInProgressError
from jaxcache.units import parse_bytes, parse_duration

if TYPE_CHECKING:
    from jaxcache.service.app import State

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
COOKIE = "jaxcache_token"
COOKIE_MAX_AGE_S = 12 * 3600
ENTRY_FILTERS = ("function", "min_size", "max_size", "unused_for", "older_than", "status", "job", "jaxlib",
                 "topology")
ENTRY_SORTS = {"name": "Function / key", "size": "Size", "compile": "Compile s", "created": "Created",
               "last_used": "Last used", "hits": "Hits"}
PAGE_SIZES = (25, 50, 100, 250, 1000)
POLICY_TEXT = ("max_total_bytes", "unused_for", "older_than", "min_age", "stale_jaxlib_window")
POLICY_LISTS = ("functions", "keep", "integrity")
POLICY_FLAGS = ("corrupt", "orphans", "stale_jaxlib")
POLICY_FIELDS = POLICY_TEXT + POLICY_LISTS + POLICY_FLAGS
MAX_SHOWN = 500  # rows of a prune plan shown on the page (the API's answer lists all)
_SPLIT = re.compile(r"[\s,]+")

# No inline script or style anywhere, so the policy can forbid both; every asset is served from here.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class _ToLogin(Exception):
    """A page needs a token the browser did not send: go to the login form, then come back."""

    def __init__(self, next_url: str, *, expired: bool) -> None:
        super().__init__(next_url)
        self.next_url, self.expired = next_url, expired


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: from the Authorization header, the login cookie, or nobody (open reads)."""

    who: str
    scope: str | None  # the token's scope; None when anonymous
    token: str | None
    source: str  # "header", "cookie" or "none"
    can_admin: bool


def _credential(request: Request) -> tuple[str | None, str]:
    kind, _, token = request.headers.get("authorization", "").partition(" ")
    if kind.lower() == "bearer" and token.strip():
        return token.strip(), "header"
    cookie = request.cookies.get(COOKIE, "")
    return (cookie, "cookie") if cookie.strip() else (None, "none")


def _safe_next(value: str | None) -> str:
    """Only a path on this site: never another host (``//x``, ``/\\x``, ``https:``)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")) or any(c in value for c in "\r\n"):
        return "/"
    return value


def _split(text: str) -> list[str]:
    return [p for p in _SPLIT.split(text) if p]


class Dashboard:
    """The pages, bound to one service's state."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._secret = secrets.token_bytes(32)  # per-form tokens of anonymous viewers (--insecure-no-auth)
        self.env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True)
        versions = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:12] for p in STATIC.iterdir() if p.is_file()}
        self.env.globals.update(static=lambda name: f"/static/{name}?v={versions[name]}", sorts=ENTRY_SORTS,
                                page_sizes=PAGE_SIZES, max_shown=MAX_SHOWN)
        for name in ("size", "seconds", "rate", "count", "utc", "ago", "short_key"):
            self.env.filters[name] = getattr(fmt, name)

    # ---- auth ------------------------------------------------------------------------------------------------

    def grants(self, token: str | None, scope: str) -> bool:
        try:
            self.state.auth.check_token(token, scope)
        except HTTPException:
            return False
        return True

    def viewer(self, request: Request, scope: str = "read") -> Viewer:
        """The viewer, or raise: a browser without a (valid) cookie goes to the login form; 401 and 403 else."""
        token, source = _credential(request)
        try:
            principal = self.state.auth.check_token(token, scope)
        except HTTPException as exc:
            if exc.status_code == 401 and source != "header" and request.method == "GET":
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                raise _ToLogin(target, expired=source == "cookie") from None
            raise
        return Viewer(who=principal.who, scope=principal.scope, token=token, source=source,
                      can_admin=scope == "admin" or self.grants(token, "admin"))

    def csrf(self, viewer: Viewer, action: str) -> str:
        """The per-form token: only someone holding the viewer's token can compute it."""
        key = viewer.token.encode() if viewer.token else self._secret
        return hmac.new(key, f"jaxcache-dashboard:{action}".encode(), hashlib.sha256).hexdigest()

    def check_form(self, request: Request, viewer: Viewer, form: Mapping[str, str], action: str) -> None:
        """Refuse a cross-site post. A header-authenticated request cannot be forged by another site."""
        if request.headers.get("sec-fetch-site") == "cross-site":
            raise HTTPException(403, "this form was posted from another site; nothing was changed")
        if viewer.source != "header" and not hmac.compare_digest(form.get("csrf", ""), self.csrf(viewer, action)):
            raise HTTPException(403, "this form is stale or came from another site (its form token does not "
                                     "match): reload the page and try again; nothing was changed")

    # ---- rendering -------------------------------------------------------------------------------------------

    def render(self, request: Request, template: str, *, status: int = 200, viewer: Viewer | None = None,
               cache: str | None = None, section: str | None = None, **ctx: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")

        def link(*segments: Any, **params: Any) -> str:
            path = base + "/" + "/".join(urllib.parse.quote(str(s), safe="") for s in segments)
            query = urllib.parse.urlencode({k: v for k, v in params.items() if v not in (None, "", False)})
            return path + (f"?{query}" if query else "")

        auth = self.state.auth
        html = self.env.get_template(template).render(
            request=request, link=link, viewer=viewer, cache=cache, section=section,
            caches=list(self.state.settings.caches), auth_configured=auth.configured, open_reads=auth.open_reads,
            logout_csrf=self.csrf(viewer, "logout") if viewer is not None and viewer.source == "cookie" else "",
            **ctx,
        )
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def error(self, request: Request, status: int, detail: Any, viewer: Viewer | None = None) -> HTMLResponse:
        titles = {400: "Bad request", 401: "Sign in needed", 403: "Not allowed", 404: "Not found",
                  409: "Busy", 502: "Storage unreachable"}
        return self.render(request, "error.html", status=status, viewer=viewer, title=titles.get(status, "Error"),
                           detail=detail if isinstance(detail, str) else str(detail), code=status)

    def cache_or_404(self, cache: str) -> str:
        if cache not in self.state.storages:
            raise HTTPException(404, f"no cache named {cache!r}")
        return cache


def _html_route(dashboard: Dashboard) -> type[APIRoute]:
    class HtmlRoute(APIRoute):
        """Turns errors into HTML pages (the API's handlers answer JSON)."""

        def get_route_handler(self) -> Callable:
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                try:
                    return await handler(request)
                except _ToLogin as exc:
                    target = "/login?" + urllib.parse.urlencode(
                        {"next": exc.next_url, **({"expired": "1"} if exc.expired else {})})
                    response = RedirectResponse(request.scope.get("root_path", "").rstrip("/") + target, 303)
                    if exc.expired:
                        response.delete_cookie(COOKIE, path="/")
                    return response
                except HTTPException as exc:
                    response = dashboard.error(request, exc.status_code, exc.detail)
                    if exc.status_code == 401:
                        response.headers["WWW-Authenticate"] = "Bearer"
                    return response
                except RequestValidationError as exc:
                    return dashboard.error(request, 400, "; ".join(str(e.get("msg")) for e in exc.errors()))
                except InvalidInputError as exc:
                    return dashboard.error(request, 400, str(exc))
                except JaxcacheError as exc:
                    return dashboard.error(request, 502, str(exc))

            return route

    return HtmlRoute


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form body (what HTML forms post), last value of each field."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise HTTPException(415, "post this form from the page (application/x-www-form-urlencoded)")
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True).items()}


def _policy_form(values: Mapping[str, str]) -> dict[str, str]:
    """The prune form's fields as strings, for re-rendering and for hidden fields."""
    out = {f: values.get(f, "").strip() for f in POLICY_TEXT + POLICY_LISTS}
    out.update({f: "on" if values.get(f, "").strip() else "" for f in POLICY_FLAGS})
    return out


def _policy_request(form: Mapping[str, str], *, dry_run: bool) -> PruneRequest:
    """The API's request model from the form: the same validation, the same policy."""
    data: dict[str, Any] = {f: form[f] for f in POLICY_TEXT if form[f]}
    data.update({f: _split(form[f]) for f in POLICY_LISTS if form[f]})
    data.update({f: True for f in POLICY_FLAGS if form[f]})
    try:
        return PruneRequest(**data, dry_run=dry_run)
    except ValidationError as exc:
        problems = (f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError("; ".join(problems)) from None


def install(app: FastAPI, state: State) -> Dashboard:
    """Serve the dashboard at ``/`` and its assets at ``/static`` (all shipped in the package)."""
    dash = Dashboard(state)
    router = APIRouter(route_class=_html_route(dash), include_in_schema=False)

    @router.get("/")
    def index(request: Request) -> Response:
        viewer = dash.viewer(request)
        return dash.render(request, "index.html", viewer=viewer, summaries=state.caches())

    @router.get("/login")
    def login_form(request: Request, next: str = "/", expired: str | None = None) -> Response:
        token, source = _credential(request)
        current = None
        if token is not None:
            try:
                current = dash.viewer(request)
            except (HTTPException, _ToLogin):
                current = None
        message = "Your token is no longer accepted: sign in again." if expired else None
        return dash.render(request, "login.html", viewer=current, next_url=_safe_next(next), error=message)

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = await _form(request)
        if request.headers.get("sec-fetch-site") == "cross-site":
            raise HTTPException(403, "sign in from this site's own login form")
        token, next_url = form.get("token", "").strip(), _safe_next(form.get("next"))
        try:
            state.auth.check_token(token or None, "read")
        except HTTPException as exc:
            message = ("Enter a token." if not token else "Unknown token." if exc.status_code == 401 else
                       f"{exc.detail}: the dashboard needs a read or admin token.")
            return dash.render(request, "login.html", status=exc.status_code if token else 400, viewer=None,
                               next_url=next_url, error=message)
        response = RedirectResponse(request.scope.get("root_path", "").rstrip("/") + next_url, 303)
        response.set_cookie(COOKIE, token, max_age=COOKIE_MAX_AGE_S, path="/", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        form = await _form(request)
        token, source = _credential(request)
        if source == "cookie":
            viewer = Viewer(who="", scope=None, token=token, source=source, can_admin=False)
            dash.check_form(request, viewer, form, "logout")
        response = RedirectResponse(request.scope.get("root_path", "").rstrip("/") + "/login", 303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @router.get("/caches/{cache}")
    def overview(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request)
        dash.cache_or_404(cache)
        stats = state.stats(cache)  # exactly what GET /v1/caches/{cache}/stats answers
        summary = next(c for c in state.caches() if c.name == cache)
        chart = fmt.growth_chart(stats["growth"], stats["size_bytes"])
        with state.catalog.reader() as conn:
            integrity = verification.summary(conn, cache, limit=20)  # what GET .../integrity answers
        return dash.render(request, "overview.html", viewer=viewer, cache=cache, section="overview", stats=stats,
                           summary=summary, chart=chart, integrity=integrity)

    @router.get("/caches/{cache}/entries")
    def entries(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request)
        dash.cache_or_404(cache)
        q = request.query_params
        form = {f: q.get(f, "").strip() for f in ENTRY_FILTERS}
        sort = q.get("sort") if q.get("sort") in ENTRY_SORTS else "name"
        order = q.get("order") if q.get("order") in ("asc", "desc") else "asc"
        limit = int(q["limit"]) if q.get("limit", "").isdigit() and 1 <= int(q["limit"]) <= 1000 else 50
        cursor = q.get("cursor") or None
        error, rows, next_cursor = None, [], None
        try:
            if form["status"] not in ("", "ok", "corrupt"):
                raise InvalidInputError("status: ok or corrupt")
            flt = queries.EntryFilter(
                function=form["function"] or None,
                min_size=parse_bytes(form["min_size"]) if form["min_size"] else None,
                max_size=parse_bytes(form["max_size"]) if form["max_size"] else None,
                unused_for_s=parse_duration(form["unused_for"]) if form["unused_for"] else None,
                older_than_s=parse_duration(form["older_than"]) if form["older_than"] else None,
                status=form["status"] or None, job=form["job"] or None, jaxlib=form["jaxlib"] or None,
                topology=form["topology"] or None,
            )
            with state.catalog.reader() as conn:
                found, next_cursor = queries.list_entries(conn, cache, flt, sort=sort, order=order, limit=limit,
                                                          cursor=cursor)
            rows = [queries.page_entry(r) for r in found]
        except InvalidInputError as exc:
            error = str(exc)
        params = {**form, "sort": sort, "order": order, "limit": limit}
        return dash.render(request, "entries.html", status=400 if error else 200, viewer=viewer, cache=cache,
                           section="entries", form=form, sort=sort, order=order, limit=limit, rows=rows,
                           next_cursor=next_cursor, cursor=cursor, params=params, error=error)

    @router.get("/caches/{cache}/entries/{key}")
    def entry(request: Request, cache: str, key: str) -> Response:
        viewer = dash.viewer(request)
        dash.cache_or_404(cache)
        if not entry_fmt.is_valid_key(key):
            raise HTTPException(400, "malformed key: expected <function>-<64 lower-case hex>, as JAX names entries")
        with state.catalog.reader() as conn:
            found = queries.entry_detail(conn, cache, key)  # what GET /v1/caches/{cache}/entries/{key} shows
        if found is None:
            raise HTTPException(404, f"no entry {key!r} in {cache!r} (a rescan picks up new entries)")
        entry, jobs, verdict = found
        return dash.render(request, "entry.html", viewer=viewer, cache=cache, section="entries",
                           e=entry, jobs=jobs, verdict=verdict)

    @router.get("/caches/{cache}/jobs")
    def jobs(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request)
        dash.cache_or_404(cache)
        with state.catalog.reader() as conn:
            found = queries.jobs(conn, cache, limit=1000)
        return dash.render(request, "jobs.html", viewer=viewer, cache=cache, section="jobs", jobs=found)

    @router.get("/caches/{cache}/jobs/{job}")
    def job(request: Request, cache: str, job: str) -> Response:
        viewer = dash.viewer(request)
        dash.cache_or_404(cache)
        with state.catalog.reader() as conn:
            found = queries.jobs(conn, cache, job=job, limit=1)
            if not found:
                raise HTTPException(404, f"no runs of job {job!r} reported on {cache!r}")
            missed = queries.job_misses(conn, cache, job, limit=1000)
            recent = queries.job_runs(conn, cache, job, limit=100)
        return dash.render(request, "job.html", viewer=viewer, cache=cache, section="jobs", j=found[0],
                           missed=missed, recent=recent)

    @router.get("/caches/{cache}/warmups")
    def warmup_list(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request)
        dash.cache_or_404(cache)
        return dash.render(request, "warmups.html", viewer=viewer, cache=cache, section="warmups",
                           warmups=warmups.list_warmups(state, cache))

    @router.get("/caches/{cache}/warmups/{warmup_id}")
    def warmup_detail(request: Request, cache: str, warmup_id: str) -> Response:
        viewer = dash.viewer(request)
        dash.cache_or_404(cache)
        found = warmups.get_warmup(state, cache, warmup_id)
        if found is None:
            raise HTTPException(404, f"no warm-up {warmup_id!r} ingested for {cache!r}")
        return dash.render(request, "warmup.html", viewer=viewer, cache=cache, section="warmups", w=found)

    def prune_page(request: Request, viewer: Viewer, cache: str, form: dict[str, str], *, status: int = 200,
                   preview: Any = None, error: str | None = None, applied: dict | None = None) -> Response:
        with state.catalog.reader() as conn:
            audit = queries.prunes(conn, cache, limit=50)
        return dash.render(request, "prune.html", status=status, viewer=viewer, cache=cache, section="prune",
                           form=form, preview=preview, error=error, applied=applied, audit=audit,
                           csrf=dash.csrf(viewer, f"prune:{cache}"))

    @router.get("/caches/{cache}/prune")
    async def prune_form(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request)
        dash.cache_or_404(cache)
        q = request.query_params
        form = _policy_form(q)
        preview = error = applied = None
        status = 200
        if q.get("applied", "").isdigit():
            with state.catalog.reader() as conn:
                found = queries.prunes(conn, cache, limit=1, audit_id=int(q["applied"]))
            applied = found[0] if found else None
        if q.get("preview"):
            try:
                body = _policy_request(form, dry_run=True)
                outcome = await run_in_threadpool(state.prune, cache, body, who=viewer.who)
                preview = pruning.response(outcome, dry_run=True)
            except InvalidInputError as exc:
                error, status = str(exc), 400
        return await run_in_threadpool(prune_page, request, viewer, cache, form, status=status, preview=preview,
                                       error=error, applied=applied)

    @router.post("/caches/{cache}/prune")
    async def prune_apply(request: Request, cache: str) -> Response:
        dash.cache_or_404(cache)
        form_values = await _form(request)
        form = _policy_form(form_values)
        try:
            viewer = dash.viewer(request, "admin")
        except HTTPException as exc:
            try:
                reader = dash.viewer(request)
            except (HTTPException, _ToLogin):
                raise exc from None
            message = (f"Applying a prune needs an admin token; you are signed in with "
                       f"{'a ' + reader.scope + ' token' if reader.scope else 'anonymous read access'}. "
                       "Nothing was deleted.")
            return await run_in_threadpool(prune_page, request, reader, cache, form, status=exc.status_code,
                                           error=message)
        dash.check_form(request, viewer, form_values, f"prune:{cache}")
        if form_values.get("confirm", "").strip() != cache:
            return await run_in_threadpool(
                prune_page, request, viewer, cache, form, status=400,
                error=f"To apply, type the cache name ({cache}) in the confirmation box. Nothing was deleted.")
        try:
            body = _policy_request(form, dry_run=False)
            outcome = await run_in_threadpool(state.prune, cache, body, who=viewer.who)
        except InvalidInputError as exc:
            return await run_in_threadpool(prune_page, request, viewer, cache, form, status=400,
                                           error=f"{exc}. Nothing was deleted.")
        except PruneInProgressError:
            return await run_in_threadpool(prune_page, request, viewer, cache, form, status=409,
                                           error=f"A prune of {cache} is already running; try again when it ends.")
        base = request.scope.get("root_path", "").rstrip("/")
        query = urllib.parse.urlencode({"applied": outcome.audit_id})
        return RedirectResponse(f"{base}/caches/{urllib.parse.quote(cache, safe='')}/prune?{query}", 303)

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.state.dashboard = dash
    return dash
