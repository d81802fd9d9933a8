"""A prune's answer over a large plan: at most list_limit deletions listed, counts and bytes over the whole plan,
the plan's memory given back once it is answered, its candidates read in batches sharing their strings, and the
collector paused while it is made."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time

import pytest
from fastapi.testclient import TestClient

import test_service
from conftest import fake_entries, jaxcache_serve, settled
from gc_support import collections_in, full_collections
from jaxcache.scan import scan
from jaxcache.service import memory
from jaxcache.service.app import create_app
from jaxcache.storage import open_storage
from test_service import BOTH, H_ADMIN, H_READ, _listing, age, make_settings

svc = test_service.svc  # the fixture, parametrized by BOTH


@BOTH
def test_prune_answer_lists_at_most_list_limit_and_counts_the_whole_plan(svc, cache_copy, jax_caches):
    whole = svc.post("/v1/caches/demo/prune", json={"older_than": "0s", "min_age": "0s"}, headers=H_READ).json()
    n = len(whole["delete"])
    assert n >= 3 and whole["delete_count"] == n and whole["truncated"] is False
    assert whole["protected_count"] == len(whole["protected"])
    short = svc.post("/v1/caches/demo/prune", json={"older_than": "0s", "min_age": "0s", "list_limit": 2},
                     headers=H_READ).json()
    assert _kept(short["delete"]) == _kept(whole["delete"][:2])  # the first to go, as the whole plan orders them
    assert short["delete_count"] == n and short["truncated"] is True
    assert short["bytes_freed"] == whole["bytes_freed"] and short["bytes_remaining"] == whole["bytes_remaining"]
    assert _kept(svc.post("/v1/caches/demo/prune", json={"older_than": "0s", "min_age": "0s", "list_limit": 2.0},
                          headers=H_READ).json()["delete"]) == _kept(short["delete"])  # JSON's 2.0 is the integer 2
    for bad in (-1, 1_000_001, "5", 2.5, True):
        r = svc.post("/v1/caches/demo/prune", json={"older_than": "0s", "list_limit": bad}, headers=H_READ)
        assert r.status_code == 422, (bad, r.text)
    before = _listing(cache_copy)
    applied = svc.post("/v1/caches/demo/prune", json={"older_than": "0s", "min_age": "0s", "list_limit": 0,
                                                      "dry_run": False}, headers=H_ADMIN).json()
    assert applied["delete"] == [] and applied["delete_count"] == applied["deleted"] == n
    assert len(before) - len(_listing(cache_copy)) >= n
    audit = svc.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"][0]
    assert "list_limit" not in audit["policy"]  # how much was shown is not part of what was pruned


def test_a_plan_is_streamed_counts_first_and_parses_whole(tmp_path):
    """Over a real server: the answer goes out chunked (no Content-Length: it is never whole before it is sent),
    its counts come before its lists, and what arrives is the whole plan, valid as PruneResponse."""
    import httpx

    from jaxcache.service.prune.schemas import ENCODED_AT_ONCE, PruneResponse

    root = tmp_path / "cache"
    root.mkdir()
    n = 2 * ENCODED_AT_ONCE + 7  # parts: two whole ones and a few
    keys = fake_entries(root, n, age_days=10)
    with jaxcache_serve({"demo": root}, f"sqlite:///{tmp_path / 'catalog.sqlite'}", tokens={"r": "read"}) as base:
        with httpx.stream("POST", f"{base}/v1/caches/demo/prune", headers={"Authorization": "Bearer r"}, timeout=60,
                          json={"older_than": "1d", "list_limit": 1_000_000}) as r:
            body = r.read()
        assert r.status_code == 200, body
        assert r.headers["transfer-encoding"] == "chunked" and "content-length" not in r.headers
        assert body.index(b'"delete_count"') < body.index(b'"delete":[')
        answer = PruneResponse.model_validate_json(body)
        assert answer.delete_count == n and {d.key for d in answer.delete} == keys and not answer.truncated
        assert all(d.reasons[0].startswith("created 10d") for d in answer.delete)
        short = httpx.post(f"{base}/v1/caches/demo/prune", headers={"Authorization": "Bearer r"}, timeout=60,
                           json={"older_than": "1d", "list_limit": 3}).json()
        assert _kept(short["delete"]) == _kept([d.model_dump() for d in answer.delete[:3]]) and short["truncated"]


def _kept(items: list[dict]) -> list[dict]:
    """A plan's items without their reasons: those say ages ("created 10d 1s ago"), and a second may pass between
    two plans."""
    return [{k: v for k, v in item.items() if k != "reasons"} for item in items]


def test_a_large_prune_plan_gives_its_memory_back_once_answered(tmp_path, cache_copy):
    age(cache_copy, 10)
    for release_from, expected in ((10_000, 0), (1, 1)):  # the demo cache's plan: under 10,000 entries, over 1
        settings = make_settings(tmp_path, {"demo": str(cache_copy)}, release_memory_from_entries=release_from)
        with TestClient(create_app(settings)) as client:
            settled(client)
            with full_collections() as collections:
                r = client.post("/v1/caches/demo/prune", json={"older_than": "0s"}, headers=H_READ)
            assert r.status_code == 200 and r.json()["delete_count"] > 0
            assert collections.full == expected, release_from


@BOTH
def test_plan_candidates_share_one_string_per_function(svc):
    """A million candidates must not hold a million copies of a few function names."""
    from sqlalchemy import select

    from jaxcache.service.catalog.models import EntryRow
    from jaxcache.service.prune.candidates import catalog_candidates

    catalog = svc.app.state.jaxcache.catalog
    with catalog.reader() as conn:
        keys = sorted(conn.execute(select(EntryRow.key).where(EntryRow.cache == "demo")).scalars())
    candidates = list(catalog_candidates(catalog, "demo"))
    assert sorted(c.key for c in candidates) == keys
    by_module: dict[str, list] = {}
    for c in candidates:
        by_module.setdefault(c.module, []).append(c)
    shared = [cs for cs in by_module.values() if len(cs) > 1]
    assert shared, "the demo cache has functions with several entries"
    for cs in shared:
        assert all(c.module is cs[0].module for c in cs)
    statuses = [c.status for c in candidates if c.status is not None]
    assert len({id(s) for s in statuses}) == len(set(statuses))


def test_a_plan_is_made_and_answered_with_the_collector_paused(svc, cache_copy):
    from jaxcache import prune
    from jaxcache.service.prune import route, run
    from jaxcache.service.prune.schemas import listed_json

    # The route's code, which every app's copy shares (prune/route.py makes the routes for an app, handed what they
    # run): collections_in knows a function by its code.
    made = route.routes(run.Handed(*[None] * len(dataclasses.fields(run.Handed))))
    post_prune = next(r.endpoint for r in made.routes if getattr(r, "name", None) == "post_prune")
    # The collector made to run at almost every allocation: none of its passes runs while the plan is made or
    # its listed deletions are, though many run in the same request around them.
    with collections_in(post_prune, prune.plan, listed_json) as seen:
        assert svc.post("/v1/caches/demo/prune", json={"older_than": "0s"}, headers=H_READ).status_code == 200
    assert post_prune.__qualname__ in seen.inside and not seen.inside & {"plan", "listed_json"}, seen.inside
    assert gc.isenabled()
    # What is seen of a plan made with the collector on, as the service made them before.
    candidates = [prune.Candidate.from_record(r) for r in scan(open_storage(str(cache_copy)))]
    with collections_in(prune.plan) as control:
        prune.plan(candidates, prune.PrunePolicy(older_than_s=0), now=time.time())
    assert control.inside == {"plan"}


def test_gc_paused_nests_overlaps_and_leaves_a_disabled_collector_alone():
    assert gc.isenabled()
    with memory.gc_paused():
        assert not gc.isenabled()
        with memory.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still runs
    assert gc.isenabled()

    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with memory.gc_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with memory.gc_paused():
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread's block has not ended
    release.set()
    t.join()
    assert gc.isenabled()

    with pytest.raises(RuntimeError), memory.gc_paused():
        raise RuntimeError("a failed plan")
    assert gc.isenabled()

    gc.disable()
    try:
        with memory.gc_paused():
            pass
        assert not gc.isenabled()  # someone else's to turn on
    finally:
        gc.enable()
