"""Run the service with uvicorn, after refusing configurations that would expose caches without auth."""

from __future__ import annotations

import sys

from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.service.catalog.database import masked
from jaxcache.service.settings import ServiceSettings


def check_exposure(settings: ServiceSettings) -> None:
    """Refuse to listen beyond loopback with no tokens, unless the operator said --insecure-no-auth."""
    if settings.insecure_no_auth or settings.listens_on_loopback() or settings.token_scopes():
        return
    raise InvalidInputError(
        f"refusing to listen on {settings.host} with no tokens configured: anyone who can reach it could read "
        "and delete cache entries. Configure tokens (JAXCACHE_TOKENS or JAXCACHE_TOKENS_FILE with SHA-256 "
        "hashes), listen on 127.0.0.1, or pass --insecure-no-auth for a lab."
    )


def serve(settings: ServiceSettings) -> None:
    """Build the app and serve it until interrupted."""
    import uvicorn

    from jaxcache.service.app import create_app

    check_exposure(settings)
    if not settings.caches:
        raise InvalidInputError(
            "no caches configured: pass --cache NAME=URL (e.g. --cache demo=./demo-cache) or set "
            "JAXCACHE_CACHES='{\"prod\": \"gs://bucket/jax-cache\"}'"
        )
    app = create_app(settings)
    shown = "localhost" if settings.host in ("127.0.0.1", "::1", "localhost") else settings.host
    print(f"jaxcache service: http://{shown}:{settings.port}/ (dashboard; API docs at /docs; catalog"
          f" {masked(settings.catalog_url)})", file=sys.stderr, flush=True)
    for name, storage in app.state.jaxcache.storages.items():
        try:
            storage.ping()
            print(f"  cache {name!r}: {storage.url}", file=sys.stderr)
        except JaxcacheError as exc:  # served anyway: the rows it has stay, and it is rescanned once it is back
            print(f"  cache {name!r}: {storage.url} (not readable now: {exc})", file=sys.stderr)
    # asyncio's loop, not uvloop: uvloop serves more requests a second but unfairly under load (bench/api.py,
    # 32 clients on distinct pages: p99 1.02 s against asyncio's 0.22 s, p50 101 against 125 ms).
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", access_log=False, loop="asyncio")
