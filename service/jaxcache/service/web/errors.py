"""The one place the service's own errors become HTTP statuses, 405s say what the resource allows, and 422s never
fail on what they echo back."""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from jaxcache.errors import InvalidInputError, JaxcacheError, PreconditionFailedError, StorageError
from jaxcache.jsontree import leaves, map_leaves
from jaxcache.service.catalog.locks import LockBusyError
from jaxcache.service.reports.inbox import InboxFullError


def status_of(exc: JaxcacheError) -> int:
    """400 for bad input, 409 for a conflict, 502 when storage failed, 500 otherwise."""
    if isinstance(exc, InvalidInputError):
        return 400
    if isinstance(exc, PreconditionFailedError | LockBusyError):
        return 409
    if isinstance(exc, StorageError):
        return 502
    return 500


#: What a 422 says of each place a body holds NaN, Infinity or a number too large for a double (Python's json reads
#: all three; JSON has none of them, and the answer could not echo them back).
NON_FINITE = ("is not a finite number: JSON has no NaN or Infinity (RFC 8259), and numbers beyond a double's range "
              "read as Infinity; send a finite number")


def _spelled(value: Any) -> Any:
    """A NaN or infinite float as JSON-like text (``"NaN"``, ``"-Infinity"``), which JSON can carry; else itself."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def _answerable(value: Any) -> Any:
    """A leaf of a problem's input as JSON can carry it: NaN spelled out, bytes (a body of another content type)
    as text, anything else through FastAPI's encoder."""
    if value is None or isinstance(value, str | int | float):
        return _spelled(value)
    return jsonable_encoder(value)


def unprocessable(exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 in its shape (``UnprocessableModel``), for any body: a problem of its own for each NaN or
    infinite number (a validator's message about one would only confuse), then FastAPI's problems elsewhere.
    Bodies are walked with loops (``jaxcache.jsontree``): one nested as deep as the JSON decoder allows is a 422
    too."""
    places = {("body", *path): value for path, value in leaves(exc.body)
              if isinstance(value, float) and not math.isfinite(value)}
    problems: list[dict[str, Any]] = [
        {"loc": list(loc), "msg": f"{_spelled(value)} {NON_FINITE}", "type": "finite_number",
         "input": _spelled(value)} for loc, value in places.items()]
    for p in exc.errors():
        if tuple(p.get("loc", ())) in places:
            continue
        # The input as it came (decoded JSON), spelled out: a NaN in it cannot fail the answer; the rest (a
        # validator's context) through FastAPI's encoder.
        problem = jsonable_encoder({k: v for k, v in p.items() if k != "input"})
        if "input" in p:
            problem["input"] = map_leaves(p["input"], _answerable)
        problems.append(map_leaves(problem, _spelled))
    return JSONResponse({"detail": problems}, status_code=422)


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
    """Answer a JaxcacheError a route raises with its status and message; give every 405 its Allow header; answer
    every 422 without failing on NaN or Infinity in the body."""

    @app.exception_handler(JaxcacheError)
    async def jaxcache_error(_request: Request, exc: JaxcacheError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status_of(exc))

    # FastAPI's own handler echoes each input back and fails on NaN (the JSON encoder refuses it): a 500.
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return unprocessable(exc)

    @app.exception_handler(InboxFullError)
    async def inbox_full(_request: Request, exc: InboxFullError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": str(exc.retry_after_s)})

    # Starlette's router answers 405 from the first route whose path matches, naming only that route's methods:
    # a path served by GET and DELETE routes would say `Allow: GET`. (Only 405s come here: no cost otherwise.)
    @app.exception_handler(405)
    async def method_not_allowed(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = {**(exc.headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return JSONResponse({"detail": exc.detail}, status_code=405, headers=headers)
