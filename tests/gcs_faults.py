"""A fault-injecting HTTP proxy in front of fake-gcs-server: GCS answering 403/429/503, losing or cutting responses.

Everything is forwarded to the emulator unchanged unless a test asked otherwise (:meth:`GcsFaults.fail`,
:meth:`GcsFaults.drop`, :meth:`GcsFaults.tear`), so the real google-cloud-storage client, its retries and the real
emulator do the rest.
Clients created after STORAGE_EMULATOR_HOST names :attr:`GcsFaults.url` (subprocesses too) go through it.
``delay_s`` adds that much latency to every request (each on its own thread, so concurrent requests overlap);
bench/start.py uses it as a network round trip. :meth:`GcsFaults.throttle` answers 503 past a rate, as a store's
request-rate limit does (bench/fleet_start.py's fleet).
"""

from __future__ import annotations

import http.client
import json
import re
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Per connection, not end to end: never forwarded (http.client and the handler frame each side themselves).
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
               "content-length", "host"}
_REASONS = {403: "forbidden", 429: "rateLimitExceeded", 503: "backendError"}


@dataclass
class _Fault:
    status: int | None  # None: forward the request, then drop the response (or, with tear, half of it)
    remaining: int
    method: str | None
    path: re.Pattern[str] | None
    body: re.Pattern[bytes] | None = None
    tear: bool = False
    until: float | None = None  # time.monotonic() after which it stops matching

    def matches(self, method: str, path: str, body: bytes = b"") -> bool:
        return (self.remaining > 0 and (self.until is None or time.monotonic() < self.until)
                and (self.method is None or self.method == method)
                and (self.path is None or self.path.search(path) is not None)
                and (self.body is None or self.body.search(body) is not None))


class GcsFaults:
    """The proxy (started on a free loopback port) and what it should do to the next requests. Thread-safe."""

    def __init__(self, upstream: str, *, delay_s: float = 0.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        #: ``(method, path, what)`` of every request, in arrival order; ``what`` is a status code or "dropped".
        self.log: list[tuple[str, str, int | str]] = []
        #: ``time.time()`` at which each request of :attr:`log` arrived, in the same order.
        self.arrived: list[float] = []
        #: The most requests that were in ``delay_s`` at once (concurrent requests overlap, they do not queue).
        self.most_delayed_at_once = 0
        self._delayed = 0
        self._rate: float | None = None  # throttle(): requests forwarded per second, at most
        self._forwarded: deque[float] = deque()  # time.monotonic() of those forwarded in the last second
        self._server = _Server(self)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="gcs-faults", daemon=True)
        self._thread.start()

    def fail(self, count: int, status: int = 503, *, method: str | None = None, path: str | None = None,
             body: bytes | None = None) -> None:
        """Answer the next ``count`` requests (those with ``method`` whose path and query match the regex ``path``,
        and whose body the regex ``body``) with ``status`` and a JSON error body as GCS sends, without forwarding
        them."""
        self._add(_Fault(status, count, method, re.compile(path) if path else None,
                         re.compile(body) if body else None))

    def fail_for(self, seconds: float, status: int = 503, *, method: str | None = None,
                 path: str | None = None) -> None:
        """Answer every matching request with ``status`` (as :meth:`fail`) for the next ``seconds``."""
        fault = _Fault(status, 1 << 62, method, re.compile(path) if path else None,
                       until=time.monotonic() + seconds)
        self._add(fault)

    def throttle(self, per_s: float | None) -> None:
        """From now on answer 503 (the store's way, as :meth:`fail`) to every request that arrives when ``per_s``
        were already let through in the last second, without forwarding it; None: let everything through again."""
        with self._lock:
            self._rate = per_s
            self._forwarded.clear()

    def tear(self, count: int = 1, *, method: str | None = None, path: str | None = None) -> None:
        """Forward the next ``count`` matching requests, then send the whole answer's headers (its full length)
        but only the first half of its body, and close the connection: a download cut off midway."""
        self._add(_Fault(None, count, method, re.compile(path) if path else None, tear=True))

    def drop(self, count: int = 1, *, method: str | None = None, path: str | None = None) -> None:
        """Forward the next ``count`` matching requests, then close the connection without answering: the server
        did the work, the client never hears of it."""
        self._add(_Fault(None, count, method, re.compile(path) if path else None))

    def injected(self) -> list[tuple[str, str, int | str]]:
        """The requests that got a fault instead of the emulator's answer."""
        with self._lock:
            return [e for e in self.log if e[2] in ("dropped", "torn") or e[2] in self.REASONS]

    #: The statuses :meth:`fail` can answer with, and the reason each gives.
    REASONS = _REASONS

    def error_answer(self, status: int) -> tuple[list[tuple[str, str]], bytes]:
        """The headers and body of an injected ``status``, as GCS sends them (a proxy for another store says it
        that store's way: tests/store_faults.py)."""
        message = f"injected {status} from {self.url}"
        error = {"code": status, "message": message,
                 "errors": [{"message": message, "domain": "global", "reason": self.REASONS[status]}]}
        return [("Content-Type", "application/json; charset=UTF-8")], json.dumps({"error": error}).encode()

    def pending(self) -> int:
        """Faults asked for but not yet served (:meth:`fail_for` windows not counted)."""
        with self._lock:
            return sum(f.remaining for f in self._faults if f.until is None)

    def requests(self, since: float = 0.0, until: float = float("inf")) -> list[tuple[str, str, int | str]]:
        """The requests of :attr:`log` that arrived between ``since`` and ``until`` (``time.time()``)."""
        with self._lock:
            return [e for e, t in zip(self.log, self.arrived, strict=True) if since <= t <= until]

    def clear(self) -> None:
        """Forget the faults not yet served: from now on everything is forwarded."""
        with self._lock:
            self._faults.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _delay(self) -> None:
        with self._lock:
            self._delayed += 1
            self.most_delayed_at_once = max(self.most_delayed_at_once, self._delayed)
        try:
            time.sleep(self.delay_s)
        finally:
            with self._lock:
                self._delayed -= 1

    def _over_rate(self) -> bool:
        with self._lock:
            if self._rate is None:
                return False
            now = time.monotonic()
            while self._forwarded and now - self._forwarded[0] >= 1.0:
                self._forwarded.popleft()
            if len(self._forwarded) >= self._rate:
                return True
            self._forwarded.append(now)
            return False

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take(self, method: str, path: str, body: bytes) -> _Fault | None:
        # Faults are served in the order they were asked for: fail(2, 503) then fail(2, 429) gives 503 503 429 429.
        with self._lock:
            fault = next((f for f in self._faults if f.matches(method, path, body)), None)
            if fault is not None:
                fault.remaining -= 1
            return fault

    def _record(self, method: str, path: str, what: int | str, arrived: float) -> None:
        with self._lock:
            self.log.append((method, path, what))
            self.arrived.append(arrived)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a client's idle keep-alive connection must not hold up close()

    def __init__(self, faults: GcsFaults) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.faults = faults

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client gone mid-answer (it exited) is no error
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as google-cloud-storage's connection pool expects
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        arrived = time.time()
        faults = self.server.faults
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            # Neither google-cloud-storage nor gcsfs sends one; fail loudly should that change.
            self.send_error(501, "the fault proxy does not read chunked request bodies")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if faults._over_rate():
            faults._record(self.command, self.path, 503, arrived)
            self._answer(503, *faults.error_answer(503))
            return
        if faults.delay_s:
            faults._delay()
        fault = faults._take(self.command, self.path, body)
        if fault is not None and fault.status is not None:
            faults._record(self.command, self.path, fault.status, arrived)
            self._answer(fault.status, *faults.error_answer(fault.status))
            return
        status, headers, payload = self._forward(faults, body)
        if fault is not None and fault.tear:
            faults._record(self.command, self.path, "torn", arrived)
            self.close_connection = True
            self._answer(status, headers, payload, send_bytes=len(payload) // 2)
            return
        if fault is not None:
            faults._record(self.command, self.path, "dropped", arrived)
            self.close_connection = True  # the handler closes the socket having written nothing
            return
        faults._record(self.command, self.path, status, arrived)
        self._answer(status, headers, payload)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    def _forward(self, faults: GcsFaults, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        up = urlsplit(faults.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            # The emulator names itself in resumable-upload session URLs: keep those going through the proxy.
            out = [(k, v.replace(faults.upstream, faults.url) if k.lower() == "location" else v)
                   for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            if self.command == "HEAD":
                out.append(("Content-Length", resp.headers.get("Content-Length", "0")))
            return resp.status, out, payload
        finally:
            conn.close()

    def _answer(self, status: int, headers: list[tuple[str, str]], payload: bytes,
                send_bytes: int | None = None) -> None:
        self.send_response_only(status)  # the emulator's own Date and Server headers pass through
        for k, v in headers:
            self.send_header(k, v)
        has_body = self.command != "HEAD" and status not in (204, 304)
        if has_body:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if has_body:
            self.wfile.write(payload if send_bytes is None else payload[:send_bytes])
