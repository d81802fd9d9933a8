"""The ASGI layer before every route: body limits (413), latency by route template, refused run records by reason."""

from __future__ import annotations

import time

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from jaxcache.service.metrics import Metrics, rejection

#: The one route whose bodies may be large: a run record lists every key a process touched.
REPORTS_PATH = "/v1/reports"

#: Set by the report route when its client left mid-upload: the job's doing, so not counted as a refusal.
ABORTED = "jaxcache.aborted"

class LimitsAndMetrics:
    """Rejects oversized bodies (413) and records latency; plain ASGI, as BaseHTTPMiddleware is slow per request."""

    def __init__(self, app, *, metrics: Metrics, max_body_bytes: int, max_report_bytes: int) -> None:
        self.app, self.metrics, self.max_body_bytes = app, metrics, max_body_bytes
        self.max_report_bytes = max_report_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        reports = scope["path"] == REPORTS_PATH
        limit = self.max_report_bytes if reports else self.max_body_bytes
        if reports and scope["method"] == "POST":
            # A job's refused report is lost (its client only warns): count each, whatever refused it.
            answered, inner_send = False, send

            async def send(message) -> None:
                nonlocal answered
                if message["type"] == "http.response.start":
                    answered = True
                    if message["status"] >= 400 and not scope.get(ABORTED):
                        self.metrics.reports_rejected.labels(rejection(message["status"])).inc()
                await inner_send(message)
        else:
            answered = True
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
        except Exception:
            if not answered:  # Starlette's outermost layer answers it 500, through a send we never see
                self.metrics.reports_rejected.labels("error").inc()
            raise
        finally:
            template = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.request_seconds.labels(template, scope["method"]).observe(time.perf_counter() - started)
