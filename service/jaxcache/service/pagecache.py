"""Pages of entry listings answered again from memory while nothing in their cache changed.

Listings are the hottest route (dashboards open on many screens, scripts paging through a cache), and a cache's
catalog changes only when a rescan finds something, a report arrives, or a prune or delete runs. A page is kept at
most ``ttl_s`` seconds and no longer than its cache is unchanged: every change this process or another worker of
the same ``jaxcache serve`` makes (or follows from another replica's rescan) drops the cache's pages in every
worker at once; changes that another replica makes show here within ``ttl_s``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from fastapi import HTTPException

from jaxcache.service.auth import Authenticator
from jaxcache.service.generations import ENTRIES, USAGE, Generations

#: The listing route, as the latency metric labels it.
ENTRIES_ROUTE = "/v1/caches/{cache}/entries"
_PREFIX, _SUFFIX = "/v1/caches/", "/entries"


class PageCache:
    """Rendered listing pages by (cache, query string), for at most ``ttl_s`` seconds and ``max_pages`` pages, each
    while its cache's :mod:`~jaxcache.service.generations` counters stay as they were when it was rendered."""

    def __init__(self, ttl_s: float, generations: Generations, max_pages: int = 512) -> None:
        self.ttl_s, self.max_pages, self.generations = ttl_s, max_pages, generations
        self._pages: OrderedDict[tuple[str, bytes], tuple[float, int, bytes]] = OrderedDict()
        self._lock = threading.Lock()  # pages are put and dropped from worker threads

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def generation(self, cache: str) -> int:
        """Read before the query that renders a page, passed to :meth:`put`: a change during the query then
        makes the page stale at once. Moves with every change of entries or usage (each counter only grows)."""
        return self.generations.get(cache, ENTRIES) + self.generations.get(cache, USAGE)

    def put(self, cache: str, query: bytes, body: bytes, generation: int) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._pages[(cache, query)] = (time.monotonic() + self.ttl_s, generation, body)
            self._pages.move_to_end((cache, query))
            while len(self._pages) > self.max_pages:
                self._pages.popitem(last=False)

    def get(self, cache: str, query: bytes) -> bytes | None:
        found = self._pages.get((cache, query))
        if found is None:
            return None
        expires, generation, body = found
        if generation != self.generation(cache) or time.monotonic() > expires:
            with self._lock:
                self._pages.pop((cache, query), None)
            return None
        return body


class ServeCachedPages:
    """ASGI layer in front of the app: a GET of a listing page it holds, by a caller the route would let read,
    is answered here. Everything else (misses, callers without a valid token) goes to the route, which renders,
    stores, or refuses with the usual 401/403."""

    def __init__(self, app, *, pages: PageCache, auth: Authenticator) -> None:
        self.app, self.pages, self.auth = app, pages, auth

    async def __call__(self, scope, receive, send) -> None:
        if self.pages.enabled and scope["type"] == "http" and scope["method"] == "GET":
            path: str = scope["path"]
            if path.startswith(_PREFIX) and path.endswith(_SUFFIX):
                cache = path[len(_PREFIX) : -len(_SUFFIX)]
                body = self.pages.get(cache, scope["query_string"]) if "/" not in cache else None
                if body is not None and self._may_read(scope):
                    scope["jaxcache.route"] = ENTRIES_ROUTE
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)

    def _may_read(self, scope) -> bool:
        token = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                kind, _, rest = value.decode("latin-1").partition(" ")
                token = rest if kind.lower() == "bearer" else None
                break  # the first, as the routes read it
        try:
            self.auth.check_token(token, "read")
        except HTTPException:
            return False
        return True
