"""Token scopes on every API route (#58, kept from the red team's round two): each route answers a token of the scope
docs/operator-guide.md "Routes" gives it (or admin), 403 to a token of another scope, and 401 to no token, an
unknown one, the SHA-256 the service is configured with, another auth scheme, or the dashboard's cookie. The table
below must list every `/v1/` operation the OpenAPI document has, so a new route cannot go unchecked."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache.service.app import create_app
from jaxcache.service.dashboard import site
from reports_support import ADMIN, READ, REPORT, hit, run, settings, sha

KEY = f"jit_f-{'0' * 64}"
READS = {"read": READ, "report": REPORT, "admin": ADMIN}
GRANTS = {"read": {"read", "admin"}, "report": {"report", "admin"}, "admin": {"admin"},
          "read or report": {"read", "report", "admin"}}

# (method, OpenAPI path, request) -> the scope operator-guide.md gives the route
ROUTES = {
    ("GET", "/v1/caches", "/v1/caches"): "read",
    ("GET", "/v1/caches/{cache}/entries", "/v1/caches/demo/entries"): "read",
    ("GET", "/v1/caches/{cache}/entries/{key}", f"/v1/caches/demo/entries/{KEY}"): "read",
    ("DELETE", "/v1/caches/{cache}/entries/{key}", f"/v1/caches/demo/entries/{KEY}"): "admin",
    ("GET", "/v1/caches/{cache}/stats", "/v1/caches/demo/stats"): "read",
    ("GET", "/v1/caches/{cache}/jobs", "/v1/caches/demo/jobs"): "read",
    ("GET", "/v1/caches/{cache}/jobs/{job}", "/v1/caches/demo/jobs/train"): "read",
    ("GET", "/v1/caches/{cache}/jobs/{job}/working-set", "/v1/caches/demo/jobs/train/working-set"): "read",
    ("GET", "/v1/working-set", "/v1/working-set?cache_dir={root}&job=train"): "read or report",
    ("POST", "/v1/reports", "/v1/reports?cache=demo"): "report",
    ("POST", "/v1/caches/{cache}/prune", "dry run"): "read",
    ("POST", "/v1/caches/{cache}/prune", "applied"): "admin",
    ("GET", "/v1/caches/{cache}/prunes", "/v1/caches/demo/prunes"): "read",
    ("GET", "/v1/caches/{cache}/pins", "/v1/caches/demo/pins"): "read",
    ("PUT", "/v1/caches/{cache}/pins/{pattern}", "/v1/caches/demo/pins/jit_scope*"): "admin",
    ("DELETE", "/v1/caches/{cache}/pins/{pattern}", "/v1/caches/demo/pins/jit_scope*"): "admin",
    ("POST", "/v1/caches/{cache}/rescan", "/v1/caches/demo/rescan"): "admin",
    ("GET", "/v1/caches/{cache}/warmups", "/v1/caches/demo/warmups"): "read",
    ("GET", "/v1/caches/{cache}/warmups/{warmup_id}", "/v1/caches/demo/warmups/w1"): "read",
    ("POST", "/v1/caches/{cache}/verify", "/v1/caches/demo/verify"): "admin",
    ("GET", "/v1/caches/{cache}/integrity", "/v1/caches/demo/integrity"): "read",
    ("GET", "/v1/integrity", "/v1/integrity?cache_dir={root}"): "read or report",
    ("POST", "/v1/integrity/digests", "/v1/integrity/digests"): "read or report",
}


@pytest.fixture(scope="module")
def scoped(tmp_path_factory):
    """The service over an empty cache (every route's answer is quick), tokens of the three scopes."""
    tmp = tmp_path_factory.mktemp("token-scopes")
    (tmp / "cache").mkdir()
    with TestClient(create_app(settings(tmp, {"demo": str(tmp / "cache")}))) as client:
        settled(client)
        yield client, str(tmp / "cache")


def _ask(client, root: str, method: str, target: str, **kw):
    """One request to the route: a body where it takes one."""
    if target in ("dry run", "applied"):
        body = {"functions": ["jit_nothing_matches*"], "min_age": "0s", "dry_run": target == "dry run"}
        return client.post("/v1/caches/demo/prune", json=body, **kw)
    if target.startswith("/v1/reports"):
        record = run("scopes", "r1", [hit(KEY, 1, time.time())]).to_json()
        kw["headers"] = {**kw.get("headers", {}), "content-type": "application/json"}
        return client.post(target, content=record, **kw)
    if target == "/v1/integrity/digests":
        return client.post(target, json={"cache_dir": root, "keys": [KEY]}, **kw)
    return client.request(method, target.format(root=root), **kw)


def test_the_table_lists_every_route_of_the_api(scoped):
    client, _ = scoped
    documented = {(m.upper(), p) for p, ops in client.get("/openapi.json").json()["paths"].items()
                  for m in ops if p.startswith("/v1/")}
    assert documented == {(m, p) for m, p, _ in ROUTES}


@pytest.mark.parametrize("route", list(ROUTES), ids=[f"{m} {t}" for m, _, t in ROUTES])
def test_each_route_answers_the_scopes_it_is_documented_for(scoped, route):
    client, root = scoped
    method, _, target = route
    granted = GRANTS[ROUTES[route]]
    for scope, token in READS.items():
        r = _ask(client, root, method, target, headers={"Authorization": f"Bearer {token}"})
        if scope in granted:
            assert r.status_code not in (401, 403), (scope, r.status_code, r.text[:300])
        else:
            assert r.status_code == 403 and f"the {scope!r} scope" in r.json()["detail"], (scope, r.text[:300])
    refused = {"no token": {}, "an unknown token": {"Authorization": "Bearer nope"},
               "the configured hash": {"Authorization": f"Bearer {sha(ADMIN)}"},
               "the admin token as Basic": {"Authorization": f"Basic {ADMIN}"},
               "the admin token alone": {"Authorization": ADMIN}}
    for what, headers in refused.items():
        r = _ask(client, root, method, target, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (what, r.status_code, r.text[:300])
    client.cookies.set(site.COOKIE, ADMIN)  # the dashboard's login cookie: the API wants the header
    try:
        assert _ask(client, root, method, target).status_code == 401
    finally:
        client.cookies.clear()
