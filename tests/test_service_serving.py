"""How the service serves requests: catalog work and body parsing happen in worker threads, so one slow request
never stalls the event loop (``/healthz`` and everything else keep answering while it runs).

Nothing here measures a time: a slow request is one whose catalog statement waits in PostgreSQL for a table that
another connection holds locked, and the assertions are about what finishes before what."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache.service.app import create_app
from reports_support import H_READ, H_REPORT, hit, keys_of, run, settings
from serving_support import PATIENCE_S, HeldTable, wait_for

#: The only ``async def`` routes: none touches the catalog or storage, or parses more than a form of at most
#: JAXCACHE_MAX_BODY_BYTES; the reports route reads its body on the loop and parses it in a thread.
ASYNC_ROUTES = {
    "healthz",  # answers a constant
    "list_entries",  # the catalog read in one hop to the framework's pool, one per core at a time
    # list_entries and get_stats read the change counts (a 304 answers there) on SQLite with a connection that never
    # waits, elsewhere in one hop that the requests waiting share; get_stats reads the statistics in one hop
    "get_stats",
    "ingest_report",  # awaits the body, then parses and stores it in one hop to the framework's pool
    "swagger_ui", "redoc",  # render a page of links to packaged assets
    "login", "logout",  # a small form and a token's hash
    "prune_form", "prune_apply",  # a token's hash; catalog work and rendering through run_in_threadpool
}


def test_only_routes_that_do_no_blocking_work_run_on_the_event_loop(tmp_path, cache_copy):
    """A new ``async def`` route that queried the catalog would stall every request while it ran: such routes
    are plain ``def`` (FastAPI runs them in its thread pool), and this list is the exceptions, each checked."""
    app = create_app(settings(tmp_path, {"demo": str(cache_copy)}))
    routes = list(_api_routes(app.routes))
    assert len(routes) > 30  # every router's routes were found
    on_loop = {r.endpoint.__name__ for r in routes if inspect.iscoroutinefunction(r.endpoint)}
    assert on_loop == ASYNC_ROUTES


def _api_routes(routes: list) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        included = getattr(route, "original_router", None)  # an included router (FastAPI >= 0.16x)
        if included is not None:
            yield from _api_routes(included.routes)


@pytest.fixture
def pg_client(tmp_path, cache_copy, pg_url) -> Iterator[TestClient]:
    """A service on a PostgreSQL catalog, whose tables another connection can hold locked."""
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, db=pg_url))) as c:
        settled(c)
        yield c


def _while_held(client: TestClient, held: HeldTable, slow: Callable[[], Any]) -> tuple[list[str], Any]:
    """Start ``slow`` (a request whose catalog statement waits for ``held``), ask /healthz and another catalog
    read meanwhile, then release it; the order in which they finished, and the slow request's response."""
    finished: list[str] = []
    answer: dict[str, Any] = {}

    def slow_request() -> None:
        try:
            answer["response"] = slow()
        finally:
            finished.append("slow")

    thread = threading.Thread(target=slow_request)
    thread.start()
    # A stalled event loop answers nothing until the lock goes: this lets it go after a while, and the order of
    # what finished says so.
    bound = threading.Timer(PATIENCE_S, held.release)
    try:
        wait_for(lambda: held.waiting() > 0)  # the slow request's statement waits in the database
        bound.start()
        health = client.get("/healthz")
        assert health.status_code == 200
        assert not held.released.is_set(), "/healthz waited for the held request: it blocked the event loop"
        finished.append("healthz")
        assert client.get("/v1/caches/demo/prunes", headers=H_READ).status_code == 200  # the catalog is free
        finished.append("catalog")
    finally:
        held.release()
        bound.cancel()
        thread.join(PATIENCE_S)
    return finished, answer.get("response")


def test_healthz_answers_while_a_listing_waits_for_its_catalog_query(pg_client, pg_url):
    held = HeldTable(pg_url, "entries")
    finished, response = _while_held(
        pg_client, held, lambda: pg_client.get("/v1/caches/demo/entries?limit=5", headers=H_READ))
    assert finished == ["healthz", "catalog", "slow"]
    assert response is not None and response.status_code == 200 and response.json()["entries"]


def test_healthz_answers_while_a_large_report_waits_for_the_inbox(pg_client, pg_url, jax_caches):
    """The report's body is read on the event loop, then parsed and stored in worker threads: here its store
    waits for the inbox, which another connection holds locked (reads of it go on)."""
    train = keys_of(jax_caches["zstd"])["jit_train_step"]
    # A process that touched thousands of keys: a body of megabytes.
    many = [hit(f"jit_f{i}-{i:064x}", 1, 1_700_000_000.0 + i) for i in range(10_000)]
    record = run("big-job", "big-run", [hit(train, 2, 1_700_000_000.0), *many])
    body = record.to_json()
    assert len(body) > 1_000_000
    held = HeldTable(pg_url, "report_inbox", "EXCLUSIVE")
    finished, response = _while_held(pg_client, held, lambda: pg_client.post(
        "/v1/reports?cache=demo", content=body, headers={**H_REPORT, "content-type": "application/json"}))
    assert finished == ["healthz", "catalog", "slow"]
    assert response is not None and response.status_code == 202, response.text
    assert response.json()["keys"] == len(record.keys)


def test_the_busiest_routes_are_matched_first(client):
    """Starlette tries each route in turn: a report's POST, /healthz and listings are found before the dashboard's
    and the docs' routes are tried (last, a report's POST took 0.24 ms to find its route)."""
    from starlette.routing import Match

    def found_at(method: str, path: str) -> int:
        scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": [],
                 "query_string": b"", "app": client.app}
        return next(i for i, r in enumerate(client.app.router.routes) if r.matches(scope)[0] == Match.FULL)

    dashboard = found_at("GET", "/")
    assert found_at("POST", "/v1/reports") < found_at("GET", "/healthz") < dashboard
    assert found_at("GET", "/v1/caches/demo/entries") < dashboard
