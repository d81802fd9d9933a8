"""Run the service with uvicorn, in one or ``--workers`` processes, after refusing configurations without auth."""

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
        "hashes), listen on 127.0.0.1, or pass --insecure-no-auth for a lab.")


def listen(host: str, port: int, *, shared: bool = False,
           elsewhere: str = "pass --port, or --port 0 for any free one") -> socket.socket:
    """A TCP socket on ``host:port``, listening or (``shared``) only bound; its protocol named, or asyncio sets no
    TCP_NODELAY on it. ``elsewhere``: how to choose another port, where the caller knows (``make run PORT=``)."""
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP,
                                     flags=socket.AI_PASSIVE)[0]
        sock = _bound(address[0], address[2], address[4], shared=shared)
        if not shared:
            sock.listen(2048)
    except OSError as exc:
        raise InvalidInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another process on that "
                                f"port? {elsewhere})") from None
    return sock


def _bound(family: int, proto: int, address: Any, *, shared: bool, joining: bool = False) -> socket.socket:
    """Bound to ``address``; ``shared`` is bound alone before opening the port to the workers' sockets, so a second
    service on the same port fails here."""
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
    """Each worker's own listening socket on the held port (SO_REUSEPORT), so the kernel spreads connections evenly."""

    def __init__(self, held: socket.socket) -> None:
        self.family, self.proto, self.address = held.family, held.proto, held.getsockname()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _worker_listens, (self.family, self.proto, self.address)


def _worker_listens(family: int, proto: int, address: Any) -> socket.socket:
    sock = _bound(family, proto, address, shared=True, joining=True)
    sock.listen(2048)
    return sock


def serve(settings: ServiceSettings) -> None:
    """Build the app (checking settings, catalog and roots) and serve it, here or in ``settings.workers`` processes."""
    import uvicorn

    from jaxcache.service.app import create_app

    check_exposure(settings)
    if not settings.caches:
        raise InvalidInputError("no caches configured: pass --cache NAME=URL (e.g. --cache demo=./demo-cache) or set "
                                "JAXCACHE_CACHES='{\"prod\": \"gs://bucket/jax-cache\"}'")
    # Built here even for workers, so bad settings, migrations and roots are reported and done once, before any starts.
    app = create_app(settings)
    workers = settings.workers > 1
    sock = listen(settings.host, settings.port, shared=workers)
    port = sock.getsockname()[1]
    shown = "localhost" if settings.host in ("127.0.0.1", "::1", "localhost") else settings.host
    processes = f"; {settings.workers} worker processes" if workers else ""
    print(f"jaxcache service: http://{shown}:{port}/ (dashboard; API docs at /docs; catalog"
          f" {masked(settings.catalog_url)}{processes})", file=sys.stderr, flush=True)
    # No store is asked here: one that does not answer must not keep the port from answering. Each root is looked at
    # once the app serves, and one that cannot be reached is a line of its own (reachability.py) and in /readyz.
    for name, storage in app.state.jaxcache.storages.items():
        print(f"  cache {name!r}: {storage.url}", file=sys.stderr)
    for change in app.state.jaxcache.root_changes:
        print(f"  {change.line()}", file=sys.stderr, flush=True)
    if not workers:
        uvicorn.Server(_config(app)).run(sockets=[sock])
        return
    app.state.jaxcache.catalog.dispose()  # the workers open their own
    del app
    _serve_workers(settings, sock)


def _config(app: Any, **more: Any) -> Any:
    import uvicorn

    # asyncio's loop: uvloop is faster but unfair under load.
    return uvicorn.Config(app, log_level="info", access_log=False, loop="asyncio", **more)


#: Seconds uvicorn's supervisor waits for a worker's answer to its ping before replacing the worker.
WORKER_HEALTHCHECK_S = 60


def _serve_workers(settings: ServiceSettings, sock: socket.socket) -> None:
    """uvicorn's own worker processes (spawned: each imports and builds the app itself, from ``settings``)."""
    import tempfile

    from uvicorn.supervisors import Multiprocess

    with tempfile.TemporaryDirectory(prefix="jaxcache-metrics-") as metrics:
        # prometheus_client's own switch: workers write their values there, and any worker's /metrics sums them.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics
        # The C allocator (unless the operator chose one): malloc_trim hands its heap back; Python's arenas stay pinned.
        os.environ.setdefault("PYTHONMALLOC", "malloc")
        # uvicorn pings each worker every half second and kills one that does not answer within this many seconds.
        # Its default (5 s) kills a worker that is still importing on a busy 2-core host (seen in 2 of 5 starts), and
        # the replacement starts the same race. A worker answers from a thread of its own, so a worker whose event
        # loop is busy still answers; only a dead or wedged process is replaced, later.
        config = _config(functools.partial(worker_app, settings), factory=True, workers=settings.workers,
                         timeout_worker_healthcheck=WORKER_HEALTHCHECK_S)
        Multiprocess(config, sockets=[cast(socket.socket, WorkerSocket(sock))]).run()


def worker_app(settings: ServiceSettings) -> Any:
    """The app of one worker (uvicorn's factory); an error here stops the service rather than restarting the worker."""
    from uvicorn.config import STARTUP_FAILURE

    from jaxcache.service.app import create_app

    _die_with(os.getppid())
    try:
        return create_app(settings, prepared=True)
    except JaxcacheError as exc:
        print(f"jaxcache: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None


def _die_with(parent: int) -> None:
    """SIGKILL this worker once ``parent`` is gone, as gunicorn's do: uvicorn's serve on, holding port and locks."""
    import signal
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="jaxcache-parent-watch", daemon=True).start()
