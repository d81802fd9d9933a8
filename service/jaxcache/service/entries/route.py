"""Entries: a listing page (the hottest route), one entry with the jobs that used it, and deleting one."""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, HTTPException, Query, Request, Response

from jaxcache.errors import InvalidInputError
from jaxcache.service.entries import queries
from jaxcache.service.entries.schemas import EntryDetail, EntryPage
from jaxcache.service.state import State
from jaxcache.service.web import conditional, deps
from jaxcache.service.web.deps import ERRORS, CacheName, EntryKey, ReadAuth, check_key, state_of, storage_of
from jaxcache.service.web.fields import CURSOR, FUNCTION_GLOB, MAX_BYTES, TEXT, DurationText
from jaxcache.topology import parse_any_topology

router = APIRouter(tags=["entries"], responses=ERRORS)


@router.get("/v1/caches/{cache}/entries", response_model=EntryPage, operation_id="listEntries",
            responses={304: {"description": "the page has not changed since the `ETag` in `If-None-Match`"}})
async def list_entries(
    request: Request, cache: CacheName, _p: ReadAuth,
    function: Annotated[str | None, Query(max_length=256, pattern=FUNCTION_GLOB,
                                          description="glob over function names: * and ?")] = None,
    min_size: Annotated[int | None, Query(ge=0, le=MAX_BYTES)] = None,
    max_size: Annotated[int | None, Query(ge=0, le=MAX_BYTES)] = None,
    unused_for: Annotated[DurationText | None, Query(description="e.g. 14d", examples=["14d"])] = None,
    older_than: Annotated[DurationText | None, Query(examples=["30d"])] = None,
    status: Literal["ok", "corrupt"] | None = None,
    job: Annotated[str | None, Query(max_length=200, pattern=TEXT, description="entries this job wrote or hit")] = None,
    jaxlib: Annotated[str | None, Query(max_length=200, pattern=TEXT, description="the first writer's jaxlib version",
                                        examples=["0.12.0"])] = None,
    topology: Annotated[str | None, Query(max_length=200, pattern=TEXT,
                                          description="the first writer's topology: SxHxD or a TPU slice (v5e:4x8),"
                                                      " N slices of one (2xv5e:16x16), in any case and spacing",
                                          examples=["4x8x1", "v5e:4x8", "2xv5e:16x16"])] = None,
    sort: Literal["size", "compile", "last_used", "created", "name", "hits"] = "name",
    order: Literal["asc", "desc"] = "asc",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=2048, pattern=CURSOR,
                                        description="`next_cursor` of the previous page, with the same sort")] = None,
) -> Response:
    """A page of entries, filtered and sorted; follow `next_cursor` for the rest. Carries an `ETag`: sent back in
    `If-None-Match`, an unchanged page is answered `304` without being read again."""
    state = state_of(request)
    storage_of(request, cache)
    flt = queries.EntryFilter(
        function=function, min_size=min_size, max_size=max_size,
        unused_for_s=deps.duration(unused_for, "unused_for"), older_than_s=deps.duration(older_than, "older_than"),
        status=status, job=job, jaxlib=jaxlib, topology=_spelled(topology))
    at = _to_catalog(cursor, sort) if cursor else None
    clock = unused_for is not None or older_than is not None
    tag = None
    if conditional.asked(request):
        # Answered before the page's read takes its turn: a 304 needs the change counts, never the page.
        tag = conditional.etag(await state.generations.current(cache), clock=clock)
        if conditional.matches(request, tag):
            return conditional.not_modified(tag)
    return await anyio.to_thread.run_sync(_page, state, cache, flt, sort, order, limit, at, tag, clock,
                                          limiter=state.read_limiter)


def _page(state: State, cache: str, flt: queries.EntryFilter, sort: str, order: str, limit: int, at: str | None,
          tag: str | None, clock: bool) -> Response:
    """The page, tagged ``tag`` (by default the change counts now): counts read before the query, so a change
    meanwhile gives the next request another tag."""
    with state.catalog.reader() as conn:
        tag = tag or conditional.etag(state.generations.get(cache, conn), clock=clock)
        rows, nxt = queries.list_entries(conn, cache, flt, sort=sort, order=order, limit=limit, cursor=at)
    root = state.storages[cache].url
    page = EntryPage.model_validate({"entries": [queries.page_entry(r, root) for r in rows],
                                     "next_cursor": _from_catalog(nxt)})
    return Response(page.model_dump_json().encode(), media_type="application/json", headers=conditional.headers(tag))


def _spelled(topology: str | None) -> str | None:
    """The records' one spelling of ``topology`` (``4x8x1``, ``v5e:4x8``, ``2xv5e:16x16``); text that is no topology
    as it is."""
    if topology is None:
        return None
    try:
        return str(parse_any_topology(topology))
    except InvalidInputError:
        return topology


def _to_catalog(cursor: str, sort: str) -> str:
    """The catalog's cursor for an API cursor (``fields.CURSOR``: ``<sort value>~<key in base64url>``), or 404 when
    it continues a listing in another order."""
    value, _, key64 = cursor.partition("~")
    # Total: any base64url of valid length decodes, and bytes that are not UTF-8 still order as some text.
    raw = base64.urlsafe_b64decode(key64 + "=" * (-len(key64) % 4))
    key = raw.decode("utf-8", "replace").replace("\x00", "\ufffd")  # PostgreSQL text holds no NUL
    if (sort == "name") != (value == ""):
        other = "by name" if value == "" else "by a number (size, compile, last_used, created or hits)"
        raise HTTPException(404, f"this cursor continues a listing sorted {other}, not by {sort}: start again "
                                 "without it")
    if sort == "name":
        return queries.encode_cursor(key, key)
    return queries.encode_cursor(float(value) if "." in value else int(value), key)


def _from_catalog(cursor: str | None) -> str | None:
    """The API's spelling of the catalog's cursor of the next page."""
    if cursor is None:
        return None
    value, key = queries.decode_cursor(cursor)
    key64 = base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")
    if isinstance(value, str):
        return f"~{key64}"
    if isinstance(value, float):
        value = format(Decimal(repr(value)), "f")  # positional, exactly the float: the pattern has no exponent
        value = value if "." in value else value + ".0"
    return f"{value}~{key64}"


@router.get("/v1/caches/{cache}/entries/{key}", response_model=EntryDetail, operation_id="getEntry")
def get_entry(request: Request, cache: CacheName, key: EntryKey, _p: ReadAuth) -> EntryDetail:
    """One entry, with every job that reported it."""
    root = storage_of(request, cache).url
    check_key(key)
    with state_of(request).catalog.reader() as conn:
        found = queries.entry_detail(conn, cache, key, root)
    if found is None:
        raise HTTPException(404, f"no entry {key!r} in {cache!r} (a rescan picks up new entries)")
    entry, jobs, verdict, conflict = found
    checked = {} if verdict is None else dict(
        integrity=verdict.classification, integrity_reasons=verdict.reasons, sha256=verdict.sha256,
        attested_by=verdict.attested_by, integrity_signature=verdict.signature)
    return EntryDetail.model_validate({**entry, "jobs": jobs, **checked, "conflict": conflict})
