"""The ASGI layer in front of every route: body limits (413) and request latency by route template."""

from __future__ import annotations

import time

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from jaxcache.service.metrics import Metrics

#: The one route whose bodies may be large: a run record lists every key a process touched.
REPORTS_PATH = "/v1/reports"


class LimitsAndMetrics:
    """Rejects oversized bodies (413) and records latency by route template.

    A plain ASGI middleware: Starlette's BaseHTTPMiddleware costs about a millisecond per request.
    """

    def __init__(self, app, *, metrics: Metrics, max_body_bytes: int, max_report_bytes: int) -> None:
        self.app, self.metrics, self.max_body_bytes = app, metrics, max_body_bytes
        self.max_report_bytes = max_report_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # A run record lists every key a process touched: far bigger than any other body.
        limit = self.max_report_bytes if scope["path"] == REPORTS_PATH else self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > limit):
                response = JSONResponse({"detail": f"request body over {limit} bytes"}, 413)
                await response(scope, receive, send)
                return
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:  # chunked bodies carry no content-length
                raise HTTPException(413, f"request body over {limit} bytes")
            return message

        started = time.perf_counter()
        try:
            await self.app(scope, limited_receive, send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or scope.get("jaxcache.route", "unmatched")
            self.metrics.request_seconds.labels(template, scope["method"]).observe(time.perf_counter() - started)
