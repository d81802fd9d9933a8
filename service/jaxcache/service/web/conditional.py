"""HTTP caching of answers that change only with the catalog: an ``ETag`` from its change counts, and 304s."""

from __future__ import annotations

import time

from fastapi import Request, Response

from jaxcache.service.catalog.database import Generation

#: Kept by the caller only (answers depend on its token's scope), and checked again at each use.
CACHE_CONTROL = "private, no-cache"
#: Answers that also move with the clock (growth and usage windows, "unused for 14d") change tag this often.
CLOCK_STEP_S = 60.0


def etag(generation: Generation, *, clock: bool = False) -> str:
    """The tag of an answer computed at ``generation`` (and, where it depends on the time, in this minute)."""
    minute = f".{int(time.time() // CLOCK_STEP_S):x}" if clock else ""
    return f'"{generation.tag()}{minute}"'


def asked(request: Request) -> bool:
    """Whether the request names tags it holds (``If-None-Match``)."""
    return "if-none-match" in request.headers


def matches(request: Request, tag: str) -> bool:
    """Whether the request's ``If-None-Match`` names ``tag`` (or ``*``)."""
    named = {part.strip().removeprefix("W/") for part in request.headers.get("if-none-match", "").split(",")}
    return "*" in named or tag in named


def headers(tag: str) -> dict[str, str]:
    return {"ETag": tag, "Cache-Control": CACHE_CONTROL}


def not_modified(tag: str) -> Response:
    return Response(status_code=304, headers=headers(tag))
