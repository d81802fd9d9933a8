"""Run the service with uvicorn, in one process or in ``--workers`` processes, after refusing configurations that
would expose caches without auth."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

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


def listen(host: str, port: int, *, shared_port: bool = False, listening: bool = True) -> socket.socket:
    """A TCP socket bound to ``host:port`` (and listening, unless ``listening`` is False: a port kept for the
    workers, who listen on it each with a socket of their own, ``shared_port``). Made with its protocol named:
    connections accepted from a socket whose protocol reads 0 (uvicorn's own, for its --workers) get no
    TCP_NODELAY from asyncio, and each response's second write then waited for the client's delayed ACK (40 ms a
    keep-alive request)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "::" takes IPv4 too, as uvicorn's does
        sock.bind(address)
        if listening:
            sock.listen(2048)
    except OSError as exc:
        raise InvalidInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another process on that "
                                "port? pass --port, or --port 0 for any free one)") from None
    return sock


def serve(settings: ServiceSettings) -> None:
    """Build the app (checking the settings, the catalog and the roots) and serve it until interrupted."""
    import uvicorn

    from jaxcache.service.app import create_app

    check_exposure(settings)
    if not settings.caches:
        raise InvalidInputError(
            "no caches configured: pass --cache NAME=URL (e.g. --cache demo=./demo-cache) or set "
            "JAXCACHE_CACHES='{\"prod\": \"gs://bucket/jax-cache\"}'"
        )
    # Built here even for workers: bad settings, an unreachable catalog, a missing root and the catalog's
    # migrations are this process's to report and do, once, before any worker starts.
    app = create_app(settings)
    # With workers, each listens on the port with a socket of its own (SO_REUSEPORT): the kernel spreads
    # connections over them evenly, where on one shared socket every worker woke for each and whichever was first
    # took all that a client pool opened together (two workers then served like one, in two runs of three).
    workers = settings.workers > 1
    sock = listen(settings.host, settings.port, shared_port=workers, listening=not workers)
    port = sock.getsockname()[1]
    shown = "localhost" if settings.host in ("127.0.0.1", "::1", "localhost") else settings.host
    processes = f"; {settings.workers} worker processes" if workers else ""
    print(f"jaxcache service: http://{shown}:{port}/ (dashboard; API docs at /docs; catalog"
          f" {masked(settings.catalog_url)}{processes})", file=sys.stderr, flush=True)
    for name, storage in app.state.jaxcache.storages.items():
        try:
            storage.ping()
            print(f"  cache {name!r}: {storage.url}", file=sys.stderr)
        except JaxcacheError as exc:  # served anyway: the rows it has stay, and it is rescanned once it is back
            print(f"  cache {name!r}: {storage.url} (not readable now: {exc})", file=sys.stderr)
    for change in app.state.jaxcache.root_changes:
        print(f"  {change.line()}", file=sys.stderr, flush=True)
    if not workers:
        uvicorn.Server(_config(app)).run(sockets=[sock])
        return
    app.state.jaxcache.catalog.dispose()  # the workers open their own
    _serve_workers(settings, sock)  # the port stays held (bound, not listening) while they serve


def _config(app: Any, *, factory: bool = False) -> Any:
    """uvicorn's settings, for the one process or each worker."""
    import uvicorn

    # asyncio's loop, not uvloop: uvloop serves more requests a second but unfairly under load (bench/api.py,
    # 32 clients on distinct pages: p99 1.02 s against asyncio's 0.22 s, p50 101 against 125 ms).
    return uvicorn.Config(app, factory=factory, log_level="info", access_log=False, loop="asyncio")


def _serve_workers(settings: ServiceSettings, sock: socket.socket) -> None:
    from jaxcache.service import supervisor, workers

    # Spawned workers inherit this environment: the settings (flags included). This process, with the whole
    # service imported to check them, becomes the supervisor, which imports none of it.
    os.environ.update(workers.settings_environment(settings))
    supervisor.become(sock, settings.host, settings.workers)


def run_worker(host: str, port: int) -> None:
    """One worker process: its own socket on the port, and uvicorn serving :func:`worker_app` on it."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    try:
        sock = listen(host, port, shared_port=True)
    except JaxcacheError as exc:
        print(f"jaxcache: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None
    uvicorn.Server(_config("jaxcache.service.server:worker_app", factory=True)).run(sockets=[sock])


def worker_app() -> Any:
    """The app of one worker process (uvicorn's factory), from the settings the serving process put in the
    environment."""
    from uvicorn.config import STARTUP_FAILURE

    from jaxcache.service import supervisor, workers
    from jaxcache.service.app import create_app

    workers.die_with_parent(int(os.environ[supervisor.SUPERVISOR_ENV]))
    try:
        return create_app(ServiceSettings(), runtime=workers.Runtime(os.environ[supervisor.RUNTIME_ENV]))
    except JaxcacheError as exc:  # checked by the serving process first: something changed since
        print(f"jaxcache: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None
