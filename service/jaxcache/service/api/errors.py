"""The one place the service's own errors become HTTP statuses."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from jaxcache.errors import InvalidInputError, JaxcacheError, PreconditionFailedError, StorageError
from jaxcache.service.catalog.locks import LockBusyError


def status_of(exc: JaxcacheError) -> int:
    """400 for bad input, 409 for a conflict, 502 when storage failed, 500 otherwise."""
    if isinstance(exc, InvalidInputError):
        return 400
    if isinstance(exc, PreconditionFailedError | LockBusyError):
        return 409
    if isinstance(exc, StorageError):
        return 502
    return 500


def install(app: FastAPI) -> None:
    """Answer a JaxcacheError a route raises with its status and message."""

    @app.exception_handler(JaxcacheError)
    async def jaxcache_error(_request: Request, exc: JaxcacheError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status_of(exc))
