"""The dashboard's frame: who is looking, forms and their tokens, rendering, and routes that answer errors as pages."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.service.dashboard import format as fmt
from jaxcache.service.dashboard import names
from jaxcache.service.state import State

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
COOKIE = "jaxcache_token"
COOKIE_MAX_AGE_S = 12 * 3600
ENTRY_FILTERS = ("function", "min_size", "max_size", "unused_for", "older_than", "status", "job", "jaxlib",
                 "topology")
ENTRY_SORTS = {"name": "Function / key", "size": "Size", "compile": "Stored compile s", "created": "Created",
               "last_used": "Last used", "hits": "Hits"}
PAGE_SIZES = (25, 50, 100, 250, 1000)
MAX_SHOWN = 500  # rows of a prune plan shown on the page, and all its preview builds
# No inline script or style anywhere, so the policy can forbid both; every asset is served from here.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'",
    "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store"}


class ToLogin(Exception):
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


def credential(request: Request) -> tuple[str | None, str]:
    kind, _, token = request.headers.get("authorization", "").partition(" ")
    if kind.lower() == "bearer" and token.strip():
        return token.strip(), "header"
    cookie = request.cookies.get(COOKIE, "")
    return (cookie, "cookie") if cookie.strip() else (None, "none")


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form body (what HTML forms post), last value of each field."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise HTTPException(415, "post this form from the page (application/x-www-form-urlencoded)")
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True).items()}


def safe_next(value: str | None) -> str:
    """Only a path on this site: never another host (``//x``, ``/\\x``, ``https:``)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")) or any(c in value for c in "\r\n"):
        return "/"
    return value


class Dashboard:
    def __init__(self, state: State) -> None:
        self.state = state
        self._secret = secrets.token_bytes(32)  # per-form tokens of anonymous viewers (--insecure-no-auth)
        # finalize: every string a page shows has its format characters escaped, whichever template forgot a filter.
        self.env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True, finalize=names.finalize)
        versions = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:12] for p in STATIC.iterdir() if p.is_file()}
        self.env.globals.update(static=lambda name: f"/static/{name}?v={versions[name]}", sorts=ENTRY_SORTS,
                                page_sizes=PAGE_SIZES, max_shown=MAX_SHOWN)
        for name in ("size", "seconds", "rate", "count", "counted", "utc", "ago", "short_key"):
            self.env.filters[name] = getattr(fmt, name)
        for name in ("visible", "name", "name_text", "mixed_badge", "raw"):
            self.env.filters[name] = getattr(names, name)

    def grants(self, token: str | None, scope: str) -> bool:
        try:
            self.state.auth.check_token(token, scope)
        except HTTPException:
            return False
        return True

    def viewer(self, request: Request, scope: str = "read", *, cache: str | None = None) -> Viewer:
        """The viewer, or raise: a browser without a (valid) cookie goes to the login form; 401 and 403 else; then
        404 for a ``cache`` not configured."""
        token, source = credential(request)
        try:
            principal = self.state.auth.check_token(token, scope)
        except HTTPException as exc:
            if exc.status_code == 401 and source != "header" and request.method == "GET":
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                raise ToLogin(target, expired=source == "cookie") from None
            raise
        if cache is not None:
            self.cache_or_404(cache)
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
            logout_csrf=self.csrf(viewer, "logout") if viewer is not None and viewer.source == "cookie" else "", **ctx)
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


def html_route(dashboard: Dashboard) -> type[APIRoute]:
    class HtmlRoute(APIRoute):
        """Turns errors into HTML pages (the API's handlers answer JSON)."""

        def get_route_handler(self) -> Callable:
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                try:
                    return await handler(request)
                except ToLogin as exc:
                    target = "/login?" + urllib.parse.urlencode(
                        {"next": exc.next_url, **({"expired": "1"} if exc.expired else {})})
                    response: Response = RedirectResponse(request.scope.get("root_path", "").rstrip("/") + target, 303)
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
