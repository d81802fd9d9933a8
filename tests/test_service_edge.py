"""The API's edge, rule by rule: what the OpenAPI document states is what the routes accept, strictly typed; each
refusal has the status and body the document gives; 405s say what a path allows. (The contract test runs
schemathesis over all of it; these pin each rule down and run in seconds.)"""

from __future__ import annotations

import json
import re
import time

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxcache.service.app import create_app
from jaxcache.service.reports.ingest.route import MAX_PROCESSES
from jaxcache.service.web import fields
from jaxcache.service.web.fields import UnprocessableModel
from reports_support import BOTH, H_ADMIN, H_READ, H_REPORT, post, run, write
from reports_support import settings as service_settings

ENTRIES = "/v1/caches/demo/entries"


def _openapi(client) -> dict:
    return client.get("/openapi.json").json()


@pytest.mark.parametrize(("path", "allowed"), [
    (f"{ENTRIES}/jit_x-{'0' * 64}", "DELETE, GET"),
    ("/v1/caches/demo/pins/jit_train*", "DELETE, PUT"),
    ("/v1/caches", "GET"),
    ("/v1/caches/demo/prune", "POST"),
])
def test_a_405_allows_every_method_of_the_path(svc, path, allowed):
    for method in ("OPTIONS", "PATCH", "HEAD"):
        r = svc.request(method, path, headers=H_ADMIN)
        assert r.status_code == 405 and r.headers["allow"] == allowed, (method, path, r.headers)
    documented = {m.upper() for m in _openapi(svc)["paths"][path.replace("demo", "{cache}", 1)
                                                           .replace(f"jit_x-{'0' * 64}", "{key}")
                                                           .replace("jit_train*", "{pattern}")]}
    assert set(allowed.split(", ")) == documented


@pytest.mark.parametrize("body", [
    {"corrupt": True, "stale_jaxlib": 0}, {"corrupt": "true"}, {"corrupt": True, "dry_run": "false"},
    {"corrupt": True, "dry_run": 0}, {"max_total_bytes": True}, {"max_total_bytes": 1.5}, {"unused_for": False},
    {"unused_for": -1}, {"unused_for": "14d\n"}, {"unused_for": "fortnight"}, {"max_total_bytes": "50XB"},
    {"functions": [" "]}, {"keep": ["\u3000"], "corrupt": True}, {"functions": "jit_*"},
    {"max_total_bytes": fields.MAX_BYTES + 1},
    # A duration without its unit reads as days as well as seconds: only 0 goes without one.
    {"older_than": 3600}, {"min_age": 1e300, "corrupt": True}, {"unused_for": "14"}, {"unused_for": 0.5},
    {"stale_jaxlib": True, "stale_jaxlib_window": 7},
])
def test_prune_bodies_are_strictly_typed(svc, body):
    # A string "false" for dry_run once meant False: an applied prune. Now it is a 422, like every mistyped field.
    r = svc.post("/v1/caches/demo/prune", json=body, headers=H_ADMIN)
    assert r.status_code == 422, (body, r.status_code, r.text)
    UnprocessableModel.model_validate(r.json())


@pytest.mark.parametrize("body", [
    {"max_total_bytes": "50 GiB", "unused_for": "14 d", "min_age": 0}, {"max_total_bytes": 50.0},
    {"older_than": "1h", "keep": ["jit_train*"]}, {"stale_jaxlib": True, "stale_jaxlib_window": "7d"},
    {"functions": ["jit_*"], "min_age": "1H"}, {"max_total_bytes": fields.MAX_BYTES, "min_age": "99999999999w"},
    {"older_than": "0", "min_age": 0.0},
])
def test_well_typed_prune_bodies_are_planned_as_before(svc, body):
    r = svc.post("/v1/caches/demo/prune", json=body, headers=H_READ)
    assert r.status_code == 200 and r.json()["dry_run"] is True, (body, r.text)


def test_prune_rules_between_fields_are_stated_and_still_refused(svc):
    schema = _openapi(svc)["components"]["schemas"]["PruneRequest"]
    assert len(schema["anyOf"]) == 8 and schema["then"]["properties"]["stale_jaxlib"] == {"const": True}
    for body in ({}, {"min_age": "1h"}, {"stale_jaxlib_window": "7d", "corrupt": True}):
        assert svc.post("/v1/caches/demo/prune", json=body, headers=H_READ).status_code == 400, body


def test_verify_bodies_are_strictly_typed(svc):
    for body in ({"recheck_all": 0}, {"recheck_all": "yes"}, {"max_entries": "5"}, {"max_entries": 1.5},
                 {"max_entries": True}, {"max_entries": 0}):
        assert svc.post("/v1/caches/demo/verify", json=body, headers=H_ADMIN).status_code == 422, body
    # JSON Schema's integers include 5.0 (and so does every client that counts in doubles).
    r = svc.post("/v1/caches/demo/verify", json={"max_entries": 5.0, "recheck_all": True}, headers=H_ADMIN)
    assert r.status_code == 200 and r.json()["checked"] <= 5


@pytest.mark.parametrize(("path", "body", "where"), [
    ("prune", b'{"unused_for": NaN}', ["body", "unused_for"]),
    ("prune", b'{"max_total_bytes": Infinity}', ["body", "max_total_bytes"]),
    ("prune", b'{"corrupt": true, "min_age": -Infinity}', ["body", "min_age"]),
    ("prune", b'{"corrupt": true, "min_age": 1e999}', ["body", "min_age"]),  # beyond a double: read as Infinity
    ("prune", b'{"corrupt": true, "list_limit": NaN}', ["body", "list_limit"]),
    ("prune", b'{"corrupt": true, "dry_run": NaN}', ["body", "dry_run"]),
    ("prune", b'{"functions": ["jit_*", NaN]}', ["body", "functions", 1]),
    ("prune", b'{"corrupt": true, "unknown": {"deep": [1, Infinity]}}', ["body", "unknown", "deep", 1]),
    ("prune", b"NaN", ["body"]),
    ("prune", b"[NaN]", ["body", 0]),
    ("verify", b'{"max_entries": NaN}', ["body", "max_entries"]),
])
def test_nan_and_infinity_in_a_body_are_a_422_that_says_so(svc_module, path, body, where):
    # Python's json reads NaN and Infinity; echoed back in FastAPI's 422 they failed its encoder: a 500.
    r = svc_module.post(f"/v1/caches/demo/{path}", content=body,
                 headers={**H_ADMIN, "content-type": "application/json"})
    assert r.status_code == 422, (body, r.status_code, r.text)
    problems = UnprocessableModel.model_validate(r.json()).detail
    assert isinstance(problems, list)
    [problem] = [p for p in problems if p.loc == where]
    assert problem.type == "finite_number" and "JSON has no NaN or Infinity" in problem.msg, problems
    assert problem.input in ("NaN", "Infinity", "-Infinity")


@pytest.mark.parametrize("depth", [500, 900])
def test_a_body_nested_as_deep_as_json_allows_is_a_422(svc_module, depth):
    # The 422 echoes the input back: walked by recursion, a list 500 deep exhausted the stack (a 500).
    body = b'{"corrupt": true, "functions": ' + b"[" * depth + b"]" * depth + b"}"
    r = svc_module.post("/v1/caches/demo/prune", content=body, headers={**H_ADMIN, "content-type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    [problem] = UnprocessableModel.model_validate(r.json()).detail
    assert problem.loc == ["body", "functions", 0]


def test_keys_and_pins_follow_their_patterns(svc, jax_caches):
    key = jax_caches["zstd"].entries[0]["key"]
    assert re.fullmatch(fields.KEY.strip("^$"), key)
    assert svc.get(f"{ENTRIES}/{key}", headers=H_READ).status_code == 200
    assert svc.get(f"{ENTRIES}/jit_x-{'0' * 64}", headers=H_READ).status_code == 404
    for bad in ("jit_x-" + "A" * 64, "jit_x-" + "0" * 63, "a%5Cb-" + "0" * 64, "%00-" + "0" * 64):
        assert svc.get(f"{ENTRIES}/{bad}", headers=H_READ).status_code == 422, bad
    # Longer than a file name can be: no such entry, rather than the file system's error as a 502.
    long_key = "j" * 400 + "-" + "0" * 64
    assert svc.delete(f"{ENTRIES}/{long_key}", headers=H_ADMIN).status_code == 404
    assert svc.put("/v1/caches/demo/pins/%20%20", headers=H_ADMIN).status_code == 422  # blank
    assert svc.put("/v1/caches/demo/pins/jit_train*", headers=H_ADMIN).status_code == 200
    assert svc.post("/v1/caches/demo/prune", json={"corrupt": True}, headers=H_READ).status_code == 200


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(cursor=st.from_regex(fields.CURSOR, fullmatch=True).filter(lambda c: len(c) <= 2048),
       sort=st.sampled_from(["name", "size", "compile", "last_used", "created", "hits"]))
def test_every_cursor_the_schema_admits_is_a_place_or_a_404(svc_module, cursor, sort):
    r = svc_module.get(ENTRIES, params={"cursor": cursor, "sort": sort, "limit": 2}, headers=H_READ)
    assert r.status_code in (200, 404), (cursor, sort, r.text)
    if r.status_code == 200 and r.json()["next_cursor"] is not None:
        assert re.fullmatch(fields.CURSOR.strip("^$"), r.json()["next_cursor"])


@BOTH
def test_pages_by_each_sort_follow_the_issued_cursors(svc):
    everything = {e["key"] for e in svc.get(ENTRIES, params={"limit": 1000}, headers=H_READ).json()["entries"]}
    for sort in ("name", "size", "compile", "last_used", "created", "hits"):
        seen, cursor = [], ""  # an empty cursor is the first page, as it always was
        while cursor is not None:
            r = svc.get(ENTRIES, params={"sort": sort, "order": "desc", "limit": 3, "cursor": cursor},
                        headers=H_READ)
            assert r.status_code == 200, r.text
            seen += [e["key"] for e in r.json()["entries"]]
            cursor = r.json()["next_cursor"]
        assert len(seen) == len(set(seen)) and set(seen) == everything, sort


def test_listing_filters_state_their_rules(svc):
    for query in ("function=jit_%5Bab%5D", "function=a%00b", "unused_for=14d%0A", "older_than=soon",
                  "cursor=garbage!!", "min_size=-1", "job=a%00", "unused_for=14", "older_than=0.5"):
        r = svc.get(f"{ENTRIES}?{query}", headers=H_READ)
        assert r.status_code == 422, (query, r.text)
        UnprocessableModel.model_validate(r.json())
    assert svc.get(f"{ENTRIES}?unused_for=14%20d&function=jit_*", headers=H_READ).status_code == 200


def test_integrity_and_digests_by_dir_404_for_an_unknown_root_and_422_for_a_shared_one(tmp_path, cache_copy):
    app = create_app(service_settings(tmp_path, {"a": str(cache_copy), "b": f"file://{cache_copy}"}))
    with TestClient(app) as client:
        ask = lambda d: client.get("/v1/integrity", params={"cache_dir": d}, headers=H_REPORT)  # noqa: E731
        assert ask(str(tmp_path / "elsewhere")).status_code == 404
        assert ask("gs://no-such-bucket/jax").status_code == 404
        for bad in ("relative/dir", "", "/a\x00b"):
            assert ask(bad).status_code == 422, bad
        shared = ask(str(cache_copy))
        assert shared.status_code == 422 and "caches a, b share the root" in shared.json()["detail"]
        UnprocessableModel.model_validate(shared.json())
        digests = lambda d: client.post("/v1/integrity/digests", json={"cache_dir": d, "keys": []},  # noqa: E731
                                        headers=H_REPORT)
        assert digests(str(tmp_path / "elsewhere")).status_code == 404
        shared = digests(str(cache_copy))  # the same routing: a root two caches share names neither
        assert shared.status_code == 422 and "caches a, b share the root" in shared.json()["detail"]
        # A record whose root two caches share needs ?cache=: 422 too.
        r = post(client, run("j", "r1", [], cache_dir=str(cache_copy)))
        assert r.status_code == 422 and "?cache=" in r.json()["detail"]
        doc = _openapi(client)["paths"]["/v1/integrity"]["get"]["responses"]
        assert doc["422"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/UnprocessableModel"}


@BOTH
def test_reports_within_the_catalogs_counts_and_integral_floats(svc, keys):
    rec = json.loads(run("j", "r1", [write(keys["jit_tiny"], 1.0, time.time())]).to_json())
    too_many = {**rec, "process_count": MAX_PROCESSES + 1}
    r = post(svc, json.dumps(too_many).encode(), "?cache=demo")
    assert r.status_code == 422 and "process_count" in r.json()["detail"]  # was a 500 on PostgreSQL
    assert post(svc, json.dumps({**rec, "process_count": MAX_PROCESSES}).encode(), "?cache=demo").status_code == 202
    as_doubles = {**rec, "run_id": "r2", "process_index": 0.0, "process_count": 1.0}
    r = post(svc, json.dumps(as_doubles).encode(), "?cache=demo")
    assert r.status_code == 202 and r.json()["process_index"] == 0, r.text
    assert post(svc, json.dumps({**rec, "process_index": 0.5}).encode(), "?cache=demo").status_code == 422
    body = _openapi(svc)["components"]["schemas"]["RunRecord"]["properties"]
    assert body["process_count"]["maximum"] == MAX_PROCESSES


def test_the_bearer_scheme_marks_every_route_that_needs_a_token(svc):
    doc = _openapi(svc)
    assert doc["components"]["securitySchemes"]["bearer"]["type"] == "http"
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            marked = op.get("security") == [{"bearer": []}]
            assert marked == path.startswith("/v1/"), (method, path, op.get("security"))
            if marked:  # and it is true: without a token, 401
                r = svc.request(method.upper(), path.replace("{cache}", "demo"), json={})
                assert r.status_code == 401 or "{" in path, (method, path, r.status_code)


@pytest.fixture(scope="module")
def svc_module(tmp_path_factory, jax_caches):
    """One service for the many examples of a property test (read-only)."""
    import shutil

    tmp = tmp_path_factory.mktemp("edge")
    shutil.copytree(jax_caches["zstd"].root, tmp / "cache")
    with TestClient(create_app(service_settings(tmp, {"demo": str(tmp / "cache")}))) as client:
        client.post("/v1/caches/demo/rescan", headers=H_ADMIN)
        yield client
