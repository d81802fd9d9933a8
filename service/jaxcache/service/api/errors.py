"""The one place the service's own errors become HTTP statuses, and 405s say what the resource allows."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from jaxcache.errors import InvalidInputError, JaxcacheError, PreconditionFailedError, StorageError
from jaxcache.service.catalog.locks import LockBusyError
from jaxcache.service.ingestion.inbox import InboxFullError


def status_of(exc: JaxcacheError) -> int:
    """400 for bad input, 409 for a conflict, 502 when storage failed, 500 otherwise."""
    if isinstance(exc, InvalidInputError):
        return 400
    if isinstance(exc, PreconditionFailedError | LockBusyError):
        return 409
    if isinstance(exc, StorageError):
        return 502
    return 500


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path, by asking the routes (included routers too)."""
    scope = request.scope
    allowed = []
    for method in _METHODS:
        probe = {"type": "http", "path": scope["path"], "root_path": scope.get("root_path", ""), "method": method,
                 "headers": [], "query_string": b""}
        if any(route.matches(probe)[0] is Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


def install(app: FastAPI) -> None:
    """Answer a JaxcacheError a route raises with its status and message; give every 405 its Allow header."""

    @app.exception_handler(JaxcacheError)
    async def jaxcache_error(_request: Request, exc: JaxcacheError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status_of(exc))

    @app.exception_handler(InboxFullError)
    async def inbox_full(_request: Request, exc: InboxFullError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": str(exc.retry_after_s)})

    # Starlette's router answers 405 from the first route whose path matches, naming only that route's methods:
    # a path served by GET and DELETE routes would say `Allow: GET`. (Only 405s come here: no cost otherwise.)
    @app.exception_handler(405)
    async def method_not_allowed(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = {**(exc.headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return JSONResponse({"detail": exc.detail}, status_code=405, headers=headers)
