"""Run the service with uvicorn, in one process or in ``--workers`` processes, after refusing configurations that
would expose caches without auth."""

from __future__ import annotations

import functools
import os
import socket
import sys
from typing import Any, cast

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


def listen(host: str, port: int, *, shared: bool = False) -> socket.socket:
    """A TCP socket on ``host:port``: listening, or with ``shared`` only bound, holding the port for the workers'
    own sockets (:class:`WorkerSocket`). Made with its protocol named: connections accepted from a socket whose
    protocol reads 0 (uvicorn's own ``bind_socket``) get no TCP_NODELAY from asyncio, and each response's second
    write then waited for the client's delayed ACK (40 ms a keep-alive request)."""
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP,
                                     flags=socket.AI_PASSIVE)[0]
        sock = _bound(address[0], address[2], address[4], shared=shared)
        if not shared:
            sock.listen(2048)
    except OSError as exc:
        raise InvalidInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another process on that "
                                "port? pass --port, or --port 0 for any free one)") from None
    return sock


def _bound(family: int, proto: int, address: Any, *, shared: bool, joining: bool = False) -> socket.socket:
    """Bound to ``address``. ``shared``: the port's holder, bound alone first and only then opened to the workers'
    sockets (``joining``: one of those), so that a second service started on the same port fails here rather than
    joining the group and taking half of the first one's connections."""
    sock = socket.socket(family, socket.SOCK_STREAM, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if joining:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "::" takes IPv4 too, as uvicorn's does
    sock.bind(address)
    if shared and not joining:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


class WorkerSocket:
    """What uvicorn hands each worker in place of one shared socket: pickled to a spawned worker, it becomes that
    worker's own listening socket on the port the serving process holds (SO_REUSEPORT). The kernel then spreads
    new connections over the workers evenly. From one shared socket, the first worker to wake accepted every
    connection then waiting, so one worker served a client pool's keep-alive connections while the other idled
    (bench/README.md, "Workers' sockets"). A worker's queued connections are reset if it dies."""

    def __init__(self, held: socket.socket) -> None:
        self.family, self.proto, self.address = held.family, held.proto, held.getsockname()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _worker_listens, (self.family, self.proto, self.address)


def _worker_listens(family: int, proto: int, address: Any) -> socket.socket:
    sock = _bound(family, proto, address, shared=True, joining=True)
    sock.listen(2048)
    return sock


def serve(settings: ServiceSettings) -> None:
    """Build the app (checking the settings, the catalog and the roots) and serve it until interrupted: in this
    process, or in ``settings.workers`` processes that uvicorn starts, watches and restarts."""
    import uvicorn

    from jaxcache.service.app import create_app

    check_exposure(settings)
    if not settings.caches:
        raise InvalidInputError(
            "no caches configured: pass --cache NAME=URL (e.g. --cache demo=./demo-cache) or set "
            "JAXCACHE_CACHES='{\"prod\": \"gs://bucket/jax-cache\"}'"
        )
    # Built here even for workers: bad settings, an unreachable catalog, a missing root, the catalog's migrations
    # and the caches' roots are this process's to report and do, once, before any worker starts.
    app = create_app(settings)
    workers = settings.workers > 1
    sock = listen(settings.host, settings.port, shared=workers)
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
    del app
    _serve_workers(settings, sock)


def _config(app: Any, **more: Any) -> Any:
    """uvicorn's settings, for the one process or the workers."""
    import uvicorn

    # asyncio's loop, not uvloop: uvloop serves more requests a second but unfairly under load (bench/README.md,
    # "The event loop").
    return uvicorn.Config(app, log_level="info", access_log=False, loop="asyncio", **more)


def _serve_workers(settings: ServiceSettings, sock: socket.socket) -> None:
    """uvicorn's own worker processes (spawned: each imports and builds the app itself, from ``settings``)."""
    import tempfile

    from uvicorn.supervisors import Multiprocess

    with tempfile.TemporaryDirectory(prefix="jaxcache-metrics-") as metrics:
        # prometheus_client's own switch, read when a worker imports it: each worker's values in files there, and
        # any worker's /metrics sums them all.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics
        # The C library's allocator for the workers, unless the operator chose one: after a rescan of a million
        # entries, Python's own kept hundreds of MiB of its arenas pinned by a few live objects each, which
        # malloc_trim (memory.py) hands back from the C library's heap.
        os.environ.setdefault("PYTHONMALLOC", "malloc")
        config = _config(functools.partial(worker_app, settings), factory=True, workers=settings.workers)
        Multiprocess(config, sockets=[cast(socket.socket, WorkerSocket(sock))]).run()


def worker_app(settings: ServiceSettings) -> Any:
    """The app of one worker process (uvicorn's factory). The serving process checked the settings first: an
    error here is something that changed since, and stops the service rather than restarting the worker."""
    from uvicorn.config import STARTUP_FAILURE

    from jaxcache.service.app import create_app

    _die_with(os.getppid())
    try:
        return create_app(settings, prepared=True)
    except JaxcacheError as exc:
        print(f"jaxcache: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None


def _die_with(parent: int) -> None:
    """Stop at once (SIGKILL) once ``parent``, the serving process, is gone, as gunicorn's workers check theirs:
    uvicorn's would serve on alone, holding the port and their locks, after a ``kill -9`` of the service."""
    import signal
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="jaxcache-parent-watch", daemon=True).start()
