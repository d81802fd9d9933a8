"""What the routes take from a request, in one place: the shared state, the caller's scope, path parameters."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security.base import SecurityBase

from jaxcache import entry as fmt
from jaxcache.errors import InvalidInputError
from jaxcache.service.auth import Principal
from jaxcache.service.state import State
from jaxcache.service.web import fields
from jaxcache.service.web.fields import ErrorModel, UnprocessableModel
from jaxcache.storage import Storage
from jaxcache.units import parse_duration

#: The error answers most routes document.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorModel, "description": "malformed input"},
    401: {"model": ErrorModel, "description": "no or unknown bearer token"},
    403: {"model": ErrorModel, "description": "the token lacks the scope"},
    404: {"model": ErrorModel, "description": "no such cache or entry"},
}
#: A 422 of a route that also refuses, with a reason, what it read.
UNPROCESSABLE: dict[str, Any] = {"model": UnprocessableModel}
#: The OpenAPI name of the bearer scheme (what generated clients and the docs page's Authorize button use).
BEARER = "bearer"
#: For routes that check the token themselves (the scope depends on the body).
BEARER_REQUIRED: dict[str, Any] = {"security": [{BEARER: []}]}


def state_of(request: Request) -> State:
    """The app's shared state (a plain call, not a dependency: the hot routes pay nothing for it)."""
    return request.app.state.jaxcache


class BearerScope(SecurityBase):
    """Checks the bearer token grants ``needed``; a security scheme, so OpenAPI marks the routes that take it."""

    def __init__(self, needed: str) -> None:
        self.needed = needed
        self.scheme_name = BEARER
        self.model = HTTPBearerModel(description="a token (its SHA-256 in JAXCACHE_TOKENS) with the scope `read`, "
                                                 "`report` or `admin`; routes name the scope they need")

    async def __call__(self, request: Request) -> Principal:  # async: no thread hop for a hash and a compare
        return state_of(request).auth.check(request, self.needed)


ReadAuth = Annotated[Principal, Depends(BearerScope("read"))]
ReportAuth = Annotated[Principal, Depends(BearerScope("report"))]
AdminAuth = Annotated[Principal, Depends(BearerScope("admin"))]
ReadOrReportAuth = Annotated[Principal, Depends(BearerScope("read or report"))]
CacheName = Annotated[str, Path(description="a configured cache name", max_length=64, examples=["prod"])]
CacheDir = Annotated[str, Query(max_length=1024, pattern=fields.CACHE_DIR,
                                description="a cache root as a job spells it: an absolute directory, a file:// URL "
                                            "of one, or gs://bucket/prefix, s3://bucket/prefix or "
                                            "az://container/prefix", examples=["/mnt/jax-cache"])]
#: The error answers of a route that names its cache by root (``cache_dir``).
BY_DIR_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorModel, "description": "no configured cache has this root"},
    422: {**UNPROCESSABLE, "description": "several configured caches have this root, or the request does not match "
                                          "the schema"},
}
EntryKey = Annotated[str, Path(description="the entry key: <function>-<64 lower-case hex>", max_length=600,
                               pattern=fields.KEY)]


def storage_of(request: Request, cache: str) -> Storage:
    """The configured cache's storage, or 404."""
    storage = state_of(request).storages.get(cache)
    if storage is None:
        raise HTTPException(404, f"no cache named {cache!r}: GET /v1/caches lists them")
    return storage


def unroutable(state: State, cache_dir: str | None) -> tuple[int, list[str]]:
    """For a ``cache_dir`` naming no one cache: 422 and the caches sharing its root, or 404 and none."""
    sharing = state.caches_at(cache_dir)
    return (422, sorted(sharing)) if len(sharing) > 1 else (404, [])


def cache_of_dir(request: Request, cache_dir: str, by_name: str) -> str:
    """The configured cache whose root is ``cache_dir``, else 404 (none) or 422 (several)."""
    state = state_of(request)
    try:
        return state.cache_for(cache_dir)
    except InvalidInputError:
        status, sharing = unroutable(state, cache_dir)
        said = (f"caches {', '.join(sharing)} share the root {cache_dir!r}: ask GET /v1/caches/NAME/{by_name}"
                if sharing else f"no configured cache has the root {cache_dir!r}: GET /v1/caches lists them")
        raise HTTPException(status, said) from None


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
