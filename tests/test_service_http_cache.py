"""Caching by HTTP: listings and statistics carry an ``ETag`` made from the catalog's change counts and
``Cache-Control``; an ``If-None-Match`` that still matches gets ``304`` with no body, after the same checks as the
route itself (auth, the cache's name); any change, through this process or another replica on the catalog, gives
a new tag."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache.service.app import create_app
from test_service import ADMIN, H_ADMIN, H_READ, READ, REPORT, make_settings

PAGE = "/v1/caches/demo/entries?limit=3&sort=name"
STATS = "/v1/caches/demo/stats"


@pytest.fixture
def two_replicas(tmp_path, cache_copy, catalog_url):
    """Two apps on one catalog (SQLite, then PostgreSQL), as two replicas (or workers) are."""
    settings = make_settings(tmp_path, {"demo": str(cache_copy)}, db=catalog_url)
    with TestClient(create_app(settings)) as one, TestClient(create_app(settings)) as other:
        settled(one)
        settled(other)
        yield one, other


def _revalidate(client: TestClient, url: str, tag: str):
    return client.get(url, headers={**H_READ, "If-None-Match": tag})


@pytest.mark.parametrize("url", [PAGE, STATS])
def test_an_unchanged_answer_is_304_and_a_change_anywhere_gives_a_new_tag(two_replicas, url):
    one, other = two_replicas
    first = one.get(url, headers=H_READ)
    tag = first.headers["etag"]
    assert first.status_code == 200 and tag.startswith('"') and first.headers["cache-control"] == "private, no-cache"
    for client in (one, other):  # the counts are the catalog's: either replica answers 304
        again = _revalidate(client, url, tag)
        assert again.status_code == 304 and again.content == b"", again.text
        assert again.headers["etag"] == tag and again.headers["cache-control"] == "private, no-cache"
    assert _revalidate(one, url, f'W/{tag}, "other"').status_code == 304  # a list, a weak form
    assert _revalidate(one, url, '"other"').status_code == 200

    key = one.get(PAGE, headers=H_READ).json()["entries"][0]["key"]
    assert other.delete(f"/v1/caches/demo/entries/{key}", headers=H_ADMIN).status_code == 204
    changed = _revalidate(one, url, tag)  # the other replica's change, seen by this one at once
    assert changed.status_code == 200 and changed.headers["etag"] != tag
    if url == PAGE:
        assert key not in {e["key"] for e in changed.json()["entries"]}
    else:
        assert changed.json()["entries"] == first.json()["entries"] - 1


def test_a_304_does_not_wait_for_the_pages_being_read(two_replicas):
    """A revalidation needs the change counts, never the page: it is answered while every turn the listing's page
    reads take is held (as by the pages of other requests)."""
    one, _ = two_replicas
    assert _revalidated_while_taken(one, one.app.state.jaxcache.read_limiter) == 304, \
        "the revalidation waited for the page reads' turns"


@pytest.mark.parametrize("catalog_url", ["sqlite"], indirect=True)
def test_on_sqlite_a_304_takes_no_thread(two_replicas):
    """On SQLite the change counts are read on the event loop (in WAL mode a reader waits for no writer): a
    revalidation is answered while every thread of the framework's pool is taken, as by slow requests."""
    one, _ = two_replicas
    threads = one.portal.call(anyio.to_thread.current_default_thread_limiter)
    assert _revalidated_while_taken(one, threads) == 304, "the revalidation waited for a thread"


def _revalidated_while_taken(client: TestClient, limiter: anyio.CapacityLimiter) -> int | None:
    """The status of a revalidation of PAGE asked while every token of ``limiter`` is taken; None if it waited for
    one (it is then answered once they are given back)."""
    tag = client.get(PAGE, headers=H_READ).headers["etag"]
    takers = [object() for _ in range(int(limiter.total_tokens))]
    for taker in takers:
        client.portal.call(limiter.acquire_on_behalf_of, taker)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_revalidate, client, PAGE, tag)
        try:
            status = answer.result(timeout=30).status_code
        except TimeoutError:
            status = None
        finally:
            for taker in takers:
                client.portal.call(limiter.release_on_behalf_of, taker)
        assert answer.result().status_code == 304
    return status


def test_statistics_are_computed_once_by_the_change_for_every_replica(two_replicas):
    """After a change of the entries, the statistics are computed by what made it (a DELETE: once it has answered,
    which the test client waits for), and every replica answers them as they are: no reader waits to compute them
    again (each answer says when they were)."""
    one, other = two_replicas
    before = one.get(STATS, headers=H_READ).json()
    key = one.get(PAGE, headers=H_READ).json()["entries"][0]["key"]
    asked = time.time()
    assert other.delete(f"/v1/caches/demo/entries/{key}", headers=H_ADMIN).status_code == 204
    answered = time.time()
    after = [client.get(STATS, headers=H_READ).json() for client in (one, other, one)]
    assert after[0]["entries"] == before["entries"] - 1
    assert asked <= after[0]["computed_s"] <= answered  # by the delete, while it was asked
    entries_part = ("computed_s", "entries", "size_bytes", "by_function", "growth", "first_created_s")
    assert all({f: a[f] for f in entries_part} == {f: after[0][f] for f in entries_part} for a in after)


def test_a_prune_that_deletes_nothing_leaves_the_tags(two_replicas):
    """An applied prune that matches no entry changes nothing, so a client's tags of the listing and of the
    statistics still match; one that deletes an entry gives new ones."""
    one, other = two_replicas
    first = one.get(PAGE, headers=H_READ)
    tags = {url: one.get(url, headers=H_READ).headers["etag"] for url in (PAGE, STATS)}
    apply = {"min_age": "0s", "dry_run": False}
    nothing = other.post("/v1/caches/demo/prune", headers=H_ADMIN, json={**apply, "functions": ["no_such_fn*"]})
    assert nothing.status_code == 200 and nothing.json()["deleted"] == 0, nothing.text
    assert all(_revalidate(one, url, tag).status_code == 304 for url, tag in tags.items())
    function = first.json()["entries"][0]["function"]
    some = other.post("/v1/caches/demo/prune", headers=H_ADMIN, json={**apply, "functions": [function]})
    assert some.status_code == 200 and some.json()["deleted"] >= 1, some.text
    assert all(_revalidate(one, url, tag).status_code == 200 for url, tag in tags.items())


def test_a_304_is_answered_only_to_who_may_read(two_replicas):
    one, _ = two_replicas
    tag = one.get(PAGE, headers=H_READ).headers["etag"]
    assert one.get(PAGE, headers={"If-None-Match": tag}).status_code == 401
    assert one.get(PAGE, headers={"If-None-Match": tag, "Authorization": "Bearer nope"}).status_code == 401
    assert one.get(PAGE, headers={"If-None-Match": tag, "Authorization": f"Bearer {REPORT}"}).status_code == 403
    for token in (READ, ADMIN):
        assert one.get(PAGE, headers={"If-None-Match": tag, "Authorization": f"Bearer {token}"}).status_code == 304
    assert one.get("/v1/caches/nope/entries", headers={**H_READ, "If-None-Match": tag}).status_code == 404


def test_a_restart_gives_new_tags(tmp_path, cache_copy):
    """A client's tag from before a restart (the catalog rebuilt, or moved) is not taken for current."""
    settings = make_settings(tmp_path, {"demo": str(cache_copy)})
    with TestClient(create_app(settings)) as client:
        settled(client)
        tag = client.get(PAGE, headers=H_READ).headers["etag"]
    with TestClient(create_app(settings)) as client:
        settled(client)
        assert _revalidate(client, PAGE, tag).status_code == 200
