"""Where the service's errors become HTTP statuses, 405s name what a path allows, and 422s survive what they echo."""

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
from jaxcache.service.catalog.coordination import LockBusyError


def status_of(exc: JaxcacheError) -> int:
    """The error's own ``http_status`` where its feature gives one (a full inbox's 503), else 400 for bad input, 409
    for a conflict, 502 when storage failed, 500 otherwise: features' types are mapped without importing them."""
    if isinstance(own := getattr(exc, "http_status", None), int):
        return own
    for kind, status in ((InvalidInputError, 400), (PreconditionFailedError | LockBusyError, 409), (StorageError, 502)):
        if isinstance(exc, kind):
            return status
    return 500


#: A 422's words for a NaN or infinite number in a body: Python's json reads them, but JSON cannot echo them back.
NON_FINITE = ("is not a finite number: JSON has no NaN or Infinity (RFC 8259), and numbers beyond a double's range "
              "read as Infinity; send a finite number")


def _spelled(value: Any) -> Any:
    """A NaN or infinite float as JSON-like text (``"NaN"``, ``"-Infinity"``), which JSON can carry; else itself."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def unprocessable(exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 shape for any body, NaN and Infinity reported on their own; walked with loops, so any depth."""
    places = {("body", *path): value for path, value in leaves(exc.body)
              if isinstance(value, float) and not math.isfinite(value)}
    problems: list[dict[str, Any]] = [
        {"loc": list(loc), "msg": f"{_spelled(value)} {NON_FINITE}", "type": "finite_number",
         "input": _spelled(value)} for loc, value in places.items()]
    for p in exc.errors():
        if tuple(p.get("loc", ())) in places:
            continue
        # Encoded a leaf at a time (any depth), then NaN spelled out, so the echoed input cannot fail the answer.
        problem = jsonable_encoder({k: v for k, v in p.items() if k != "input"})
        if "input" in p:
            problem["input"] = map_leaves(p["input"], jsonable_encoder)
        problems.append(map_leaves(problem, _spelled))
    return JSONResponse({"detail": problems}, status_code=422)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path, by asking the routes (included routers too)."""
    probe = {"type": "http", "path": request.scope["path"], "root_path": request.scope.get("root_path", ""),
             "headers": [], "query_string": b""}
    return [method for method in _METHODS if any(route.matches({**probe, "method": method})[0] is Match.FULL
                                                 for route in request.app.router.routes)]


def install(app: FastAPI) -> None:
    """Install the handlers for JaxcacheError (with Retry-After where it has ``retry_after_s``), 422 and 405."""

    @app.exception_handler(JaxcacheError)
    async def jaxcache_error(_request: Request, exc: JaxcacheError) -> JSONResponse:
        after = getattr(exc, "retry_after_s", None)
        retry = {"Retry-After": str(after)} if after is not None else None
        return JSONResponse({"detail": str(exc)}, status_code=status_of(exc), headers=retry)

    # FastAPI's own handler echoes each input back and fails on NaN (the JSON encoder refuses it): a 500.
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return unprocessable(exc)

    # Starlette's Allow names only the first matching route's methods; a path with GET and DELETE would say GET.
    @app.exception_handler(405)
    async def method_not_allowed(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = {**(exc.headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return JSONResponse({"detail": exc.detail}, status_code=405, headers=headers)
