"""What the routes take from a request, in one place: the shared state, the caller's scope, path parameters."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request

from jaxcache import entry as fmt
from jaxcache.errors import InvalidInputError
from jaxcache.service.api.schemas.common import ErrorModel
from jaxcache.service.auth import Principal
from jaxcache.service.state import State
from jaxcache.storage import Storage
from jaxcache.units import parse_duration

#: The error answers most routes document.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorModel, "description": "malformed input"},
    401: {"model": ErrorModel, "description": "no or unknown bearer token"},
    403: {"model": ErrorModel, "description": "the token lacks the scope"},
    404: {"model": ErrorModel, "description": "no such cache or entry"},
}


def state_of(request: Request) -> State:
    """The app's shared state (a plain call, not a dependency: the hot routes pay nothing for it)."""
    state: State = request.app.state.jaxcache
    return state


def scope(needed: str) -> Any:
    """A dependency that checks the bearer token grants ``needed`` and returns who it is."""

    async def check(request: Request) -> Principal:  # async: no thread hop for a hash and a compare
        return state_of(request).auth.check(request, needed)

    return Depends(check)


ReadAuth = Annotated[Principal, scope("read")]
ReportAuth = Annotated[Principal, scope("report")]
AdminAuth = Annotated[Principal, scope("admin")]
ReadOrReportAuth = Annotated[Principal, scope("read or report")]
CacheName = Annotated[str, Path(description="a configured cache name", max_length=64, examples=["prod"])]
EntryKey = Annotated[str, Path(description="the entry key: <function>-<64 hex>", max_length=600)]


def storage_of(request: Request, cache: str) -> Storage:
    """The configured cache's storage, or 404."""
    storage = state_of(request).storages.get(cache)
    if storage is None:
        raise HTTPException(404, f"no cache named {cache!r}: GET /v1/caches lists them")
    return storage


def check_key(key: str) -> str:
    """``key`` if JAX could have named an entry so, else 400."""
    if not fmt.is_valid_key(key):
        raise HTTPException(400, "malformed key: expected <function>-<64 lower-case hex>, as JAX names entries")
    return key


def duration(value: str | None, name: str) -> float | None:
    """A duration parameter (``14d``) in seconds, or 400 naming the parameter."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except InvalidInputError as exc:
        raise HTTPException(400, f"{name}: {exc}") from None
