"""The catalog service through httpx against the ASGI app (FastAPI's TestClient runs the real lifespan)."""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.parse
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache import entry as fmt
from jaxcache.cli import main as cli_main
from jaxcache.service.app import create_app
from jaxcache.service.settings import ServiceSettings

READ, ADMIN, REPORT = "read-token-123", "admin-token-456", "report-token-789"
H_READ, H_ADMIN = {"Authorization": f"Bearer {READ}"}, {"Authorization": f"Bearer {ADMIN}"}


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


#: Tests marked with this run on an SQLite and on a PostgreSQL catalog (the ``svc`` fixture's parameter).
BOTH = pytest.mark.parametrize("svc", ["sqlite", "postgresql"], indirect=True)


def make_settings(tmp_path: Path, caches: dict[str, str], db: str | None = None, **kw) -> ServiceSettings:
    return ServiceSettings(**{
        "caches": caches, "db": db or f"sqlite:///{tmp_path / 'catalog.sqlite'}", "rescan_s": 3600,
        "tokens": {sha(READ): "read", sha(ADMIN): "admin", sha(REPORT): "report"}, **kw,
    })


def age(root: Path, days: float) -> None:
    """Make every file under root look created and last used ``days`` ago (deterministic ages)."""
    t = time.time() - days * 86400
    for p in root.iterdir():
        if p.is_file():
            if p.name.endswith("-atime"):
                p.write_bytes(fmt.encode_atime(int(t * 1e9)))
            os.utime(p, (t, t))


def catalog_db(request, tmp_path) -> str:
    """The catalog URL for the backend a test is parametrized with (SQLite unless it says otherwise)."""
    if getattr(request, "param", "sqlite") == "postgresql":
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'catalog.sqlite'}"


@pytest.fixture
def svc(request, tmp_path, cache_copy):
    age(cache_copy, 10)
    app = create_app(make_settings(tmp_path, {"demo": str(cache_copy)}, db=catalog_db(request, tmp_path)))
    with TestClient(app) as client:
        settled(client)
        assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
        yield client


def _all_pages(client, query: str) -> list[dict]:
    out, cursor = [], None
    for _ in range(1000):
        url = f"/v1/caches/demo/entries?{query}" + (f"&cursor={cursor}" if cursor else "")
        r = client.get(url, headers=H_READ)
        assert r.status_code == 200, r.text
        body = r.json()
        out.extend(body["entries"])
        cursor = body["next_cursor"]
        if not cursor:
            return out
    raise AssertionError("pagination never ended")


@BOTH
def test_list_caches(svc, cache_copy, jax_caches):
    body = svc.get("/v1/caches", headers=H_READ).json()
    (c,) = body["caches"]
    assert c["name"] == "demo" and c["url"] == str(cache_copy)
    assert c["entries"] == len(jax_caches["zstd"].entries)
    assert c["size_bytes"] == sum(e["size_bytes"] for e in jax_caches["zstd"].entries)
    assert c["last_scan_s"] is not None


@pytest.mark.parametrize("sort", ["size", "compile", "last_used", "created", "name"])
@pytest.mark.parametrize("order", ["asc", "desc"])
@BOTH
def test_pagination_has_no_duplicates_or_gaps(svc, jax_caches, sort, order):
    got = _all_pages(svc, f"sort={sort}&order={order}&limit=3")
    keys = [e["key"] for e in got]
    assert len(keys) == len(set(keys))
    assert set(keys) == {e["key"] for e in jax_caches["zstd"].entries}
    field = {"size": "size_bytes", "compile": "compile_seconds", "last_used": "last_used_s",
             "created": "created_s", "name": "key"}[sort]
    values = [(e[field] if e[field] is not None else -1, e["key"]) for e in got]
    assert values == sorted(values, reverse=order == "desc")


@BOTH
def test_filters(svc, jax_caches):
    entries = jax_caches["zstd"].entries
    got = _all_pages(svc, "function=jit_odd*")
    assert [e["function"] for e in got] == ["jit_odd-name.v2"]
    got = _all_pages(svc, "function=jit_?iny")
    assert [e["function"] for e in got] == ["jit_tiny"]
    big = max(e["size_bytes"] for e in entries)
    assert [e["size_bytes"] for e in _all_pages(svc, f"min_size={big}")] == [big]
    assert len(_all_pages(svc, f"max_size={big - 1}")) == len(entries) - 1
    assert len(_all_pages(svc, "unused_for=5d")) == len(entries)
    assert _all_pages(svc, "unused_for=20d") == []
    assert len(_all_pages(svc, "older_than=1d")) == len(entries)
    assert _all_pages(svc, "status=corrupt") == []
    assert len(_all_pages(svc, "status=ok")) == len(entries)


@BOTH
@pytest.mark.parametrize("glob", ["jit_*", "*_*", "*.v2", "jit?odd*", "*", "JIT_*", "*TINY", "jit_Tiny", "*tiny",
                                  "jit%", "jit\\_*", "*-name.*", "?it_t*", "jit_train_step"])
def test_function_globs_match_like_fnmatchcase(svc, jax_caches, glob):
    """The same answer as the CLI's --function (fnmatch.fnmatchcase: case-sensitive, only * and ?) on both
    backends: SQLite's LIKE would ignore case, PostgreSQL's default collation would mis-order a prefix range."""
    import fnmatch

    want = sorted(e["key"] for e in jax_caches["zstd"].entries if fnmatch.fnmatchcase(e["module"], glob))
    got = [e["key"] for e in _all_pages(svc, f"function={urllib.parse.quote(glob)}&limit=2")]
    assert got == want


@BOTH
def test_names_sort_and_match_by_code_point(svc, cache_copy, jax_caches):
    """Upper case, '_' and '.' order as code points on both backends (not as the PostgreSQL server's locale would,
    which folds case and weighs punctuation apart), so the keyset cursor and prefix ranges see one order."""
    for module in ("jit_B", "jit__x", "jit_a", "jit_B.v2", "JIT_c", "jit_Ba"):
        (cache_copy / f"{module}-{'a' * 64}-cache").write_bytes(b"not a JAX entry")
    svc.post("/v1/caches/demo/rescan", headers=H_ADMIN)
    keys = [e["key"] for e in _all_pages(svc, "sort=name&limit=2")]
    assert keys == sorted(keys) and len(keys) == len(jax_caches["zstd"].entries) + 6
    assert [e["key"] for e in _all_pages(svc, "sort=name&order=desc&limit=3")] == keys[::-1]
    assert [e["function"] for e in _all_pages(svc, "function=jit_B*")] == ["jit_B", "jit_B.v2", "jit_Ba"]


@BOTH
def test_growth_days_round_down(svc, cache_copy, jax_caches):
    # Created three quarters into a day: PostgreSQL's CAST would round that to the next day.
    day = int(time.time() // 86400) - 3
    t = day * 86400 + 0.75 * 86400
    for p in cache_copy.iterdir():
        if p.is_file():
            os.utime(p, (t, t))
    svc.post("/v1/caches/demo/rescan", headers=H_ADMIN)
    growth = svc.get("/v1/caches/demo/stats", headers=H_READ).json()["growth"]
    assert [g["day"] for g in growth] == [time.strftime("%Y-%m-%d", time.gmtime(day * 86400))]


@BOTH
def test_a_cursor_of_another_sort_is_404(svc):
    # Well formed (the schema admits it), but it names no place in this listing: 404, not 400.
    by_name = svc.get("/v1/caches/demo/entries?sort=name&limit=1", headers=H_READ).json()["next_cursor"]
    by_size = svc.get("/v1/caches/demo/entries?sort=size&limit=1", headers=H_READ).json()["next_cursor"]
    assert svc.get(f"/v1/caches/demo/entries?sort=size&cursor={by_name}", headers=H_READ).status_code == 404
    assert svc.get(f"/v1/caches/demo/entries?sort=name&cursor={by_size}", headers=H_READ).status_code == 404
    assert svc.get(f"/v1/caches/demo/entries?sort=size&cursor={by_size}", headers=H_READ).status_code == 200


def test_entry_detail_and_errors(svc, jax_caches):
    e = jax_caches["zstd"].entries[0]
    body = svc.get(f"/v1/caches/demo/entries/{e['key']}", headers=H_READ).json()
    assert body["function"] == e["module"] and body["compile_seconds"] == e["stored_compile_seconds"]
    assert body["compression"] == "zstd" and body["status"] == "ok"
    assert svc.get("/v1/caches/nope/entries", headers=H_READ).status_code == 404
    missing = "jit_x-" + "0" * 64
    assert svc.get(f"/v1/caches/demo/entries/{missing}", headers=H_READ).status_code == 404
    for bad in ["not-a-key", "jit_x-" + "Z" * 64, "..%2F..%2Fetc%2Fpasswd", "%2e%2e", "jit_x-" + "0" * 64 + "-cache"]:
        r = svc.get(f"/v1/caches/demo/entries/{bad}", headers=H_READ)
        assert r.status_code in (404, 422), (bad, r.status_code)  # 422: not the key pattern the schema states
        assert r.status_code != 500


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=1001", "limit=abc", "sort=bogus", "order=up", "min_size=-1", "status=weird",
     "cursor=garbage!!", "unused_for=forever", "function=%5Babc%5D"],
)
def test_bad_queries_are_4xx(svc, query):
    r = svc.get(f"/v1/caches/demo/entries?{query}", headers=H_READ)
    assert 400 <= r.status_code < 500, (query, r.status_code, r.text)


@BOTH
def test_stats_match_the_cli(svc, cache_copy, capsys):
    api = svc.get("/v1/caches/demo/stats", headers=H_READ).json()
    assert cli_main(["stats", str(cache_copy), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    for field in ("entries", "size_bytes", "compile_seconds", "corrupt", "orphans"):
        assert api[field] == cli[field], field
    assert api["compression"] == cli["compression"]
    assert {f["function"]: f["size_bytes"] for f in api["by_function"]} == {
        f["function"]: f["size_bytes"] for f in cli["by_function"]
    }
    assert api["growth"] and sum(g["entries"] for g in api["growth"]) == api["entries"]


def _listing(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


@BOTH
def test_prune_dry_run_changes_nothing_and_apply_deletes_the_plan(svc, cache_copy, jax_caches):
    before = _listing(cache_copy)
    policy = {"functions": ["jit_tiny", "jit_odd*"], "min_age": "1h"}
    r = svc.post("/v1/caches/demo/prune", json=policy, headers=H_READ)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["dry_run"] is True and _listing(cache_copy) == before
    planned = {d["key"] for d in plan["delete"]}
    assert {d["function"] for d in plan["delete"]} == {"jit_tiny", "jit_odd-name.v2"}

    assert svc.post("/v1/caches/demo/prune", json={**policy, "dry_run": False}, headers=H_READ).status_code == 403
    r = svc.post("/v1/caches/demo/prune", json={**policy, "dry_run": False}, headers=H_ADMIN)
    assert r.status_code == 200, r.text
    applied = r.json()
    assert applied["deleted"] == len(planned) and applied["audit_id"]
    after = _listing(cache_copy)
    gone = set(before) - set(after)
    assert gone == {k + "-cache" for k in planned} | {k + "-atime" for k in planned}
    assert all(after[n] == before[n] for n in after)  # nothing else touched
    audit = svc.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"]
    assert audit[0]["deleted"] == len(planned) and audit[0]["who"].startswith("token:")
    assert audit[0]["policy"]["functions"] == ["jit_tiny", "jit_odd*"]
    listed = {e["key"] for e in _all_pages(svc, "limit=100")}
    assert not listed & planned


@BOTH
def test_prune_respects_pins_and_grace(svc, cache_copy, jax_caches):
    assert svc.put("/v1/caches/demo/pins/jit_train*", headers=H_ADMIN).status_code == 200
    assert [p["pattern"] for p in svc.get("/v1/caches/demo/pins", headers=H_READ).json()["pins"]] == ["jit_train*"]
    plan = svc.post("/v1/caches/demo/prune", json={"older_than": "1d"}, headers=H_READ).json()
    assert "jit_train_step" not in {d["function"] for d in plan["delete"]}
    assert any("jit_train" in " ".join(d["reasons"]) for d in plan["protected"])
    plan = svc.post("/v1/caches/demo/prune", json={"older_than": "1d", "min_age": "30d"}, headers=H_READ).json()
    assert plan["delete"] == []
    assert svc.delete("/v1/caches/demo/pins/jit_train*", headers=H_ADMIN).status_code == 204
    assert svc.delete("/v1/caches/demo/pins/jit_train*", headers=H_ADMIN).status_code == 404


@pytest.mark.parametrize(
    "body",
    [{"unused_for": "14d", "unsued_for": "1s"}, {"max_total_bytes": "lots"}, {"unused_for": "-3d"},
     {"functions": "jit_*"}, {}, {"keep": ["x"]}, {"dry_run": "perhaps", "corrupt": True}],
)
def test_bad_policies_are_rejected_and_touch_nothing(svc, cache_copy, body):
    before = _listing(cache_copy)
    r = svc.post("/v1/caches/demo/prune", json={"dry_run": False, **body}, headers=H_ADMIN)
    assert 400 <= r.status_code < 500, (body, r.status_code)
    assert _listing(cache_copy) == before


@BOTH
def test_second_prune_while_one_runs_gets_409(svc):
    lock = svc.app.state.jaxcache.prune_locks.get("demo")
    assert lock.acquire(blocking=False)
    try:
        r = svc.post("/v1/caches/demo/prune", json={"corrupt": True, "dry_run": False}, headers=H_ADMIN)
        assert r.status_code == 409
    finally:
        lock.release()
    assert svc.post("/v1/caches/demo/prune", json={"corrupt": True, "dry_run": False},
                    headers=H_ADMIN).status_code == 200


@BOTH
def test_delete_entry(svc, cache_copy, jax_caches):
    e = jax_caches["zstd"].entries[0]
    assert svc.delete(f"/v1/caches/demo/entries/{e['key']}", headers=H_READ).status_code == 403
    assert svc.delete(f"/v1/caches/demo/entries/{e['key']}", headers=H_ADMIN).status_code == 204
    assert not (cache_copy / e["file"]).exists() and not (cache_copy / (e["key"] + "-atime")).exists()
    assert svc.get(f"/v1/caches/demo/entries/{e['key']}", headers=H_READ).status_code == 404
    assert svc.delete(f"/v1/caches/demo/entries/{e['key']}", headers=H_ADMIN).status_code == 404


@BOTH
def test_rescan_picks_up_changes(svc, cache_copy, jax_caches):
    e = jax_caches["zstd"].entries[1]
    (cache_copy / e["file"]).unlink()
    (cache_copy / ("jit_new-" + "1" * 64 + "-cache")).write_bytes(b"\x00")
    r = svc.post("/v1/caches/demo/rescan", headers=H_ADMIN).json()
    assert r["added"] >= 1 and r["removed"] == 1
    new = svc.get("/v1/caches/demo/entries/jit_new-" + "1" * 64, headers=H_READ).json()
    assert new["status"] == "corrupt"
    assert svc.get("/v1/caches/demo/stats", headers=H_READ).json()["corrupt"] == 1
    again = svc.post("/v1/caches/demo/rescan", headers=H_ADMIN).json()
    assert (again["added"], again["removed"]) == (0, 0)


MUTATING = [
    ("delete", "/v1/caches/demo/entries/jit_x-" + "0" * 64, None),
    ("post", "/v1/caches/demo/prune", {"corrupt": True, "dry_run": False}),
    ("put", "/v1/caches/demo/pins/jit_x*", None),
    ("delete", "/v1/caches/demo/pins/jit_x*", None),
    ("post", "/v1/caches/demo/rescan", None),
]


@pytest.mark.parametrize(("method", "url", "body"), MUTATING)
@pytest.mark.parametrize(
    ("who", "expected"),
    [(None, {401}), ("bad", {401}), (READ, {403}), (REPORT, {403}), (ADMIN, {200, 204, 404})],
)
def test_auth_matrix(svc, method, url, body, who, expected):
    headers = {} if who is None else {"Authorization": f"Bearer {who}"}
    r = svc.request(method.upper(), url, headers=headers, json=body)
    assert r.status_code in expected, (method, url, who, r.status_code, r.text)


@pytest.mark.parametrize("url", ["/v1/caches", "/v1/caches/demo/entries", "/v1/caches/demo/stats",
                                 "/v1/caches/demo/pins", "/v1/caches/demo/prunes"])
def test_reads_need_a_token_when_tokens_exist(svc, url):
    assert svc.get(url).status_code == 401
    assert svc.get(url, headers={"Authorization": f"Bearer {REPORT}"}).status_code == 403
    assert svc.get(url, headers=H_READ).status_code == 200
    assert svc.get(url, headers=H_ADMIN).status_code == 200


def test_open_reads_only_on_loopback_without_tokens(tmp_path, cache_copy):
    settings = ServiceSettings(caches={"demo": str(cache_copy)}, db=f"sqlite:///{tmp_path / 'c.sqlite'}")
    with TestClient(create_app(settings)) as c:
        assert c.get("/v1/caches").status_code == 200
        r = c.post("/v1/caches/demo/rescan")
        assert r.status_code == 401 and "no tokens configured" in r.json()["detail"]


def test_oversized_body_is_413(svc):
    big = {"functions": ["x" * 100] * 2000}
    r = svc.post("/v1/caches/demo/prune", content=json.dumps(big), headers={**H_ADMIN, "content-type":
                                                                            "application/json"})
    assert r.status_code == 413


def test_health_ready_metrics(svc):
    assert svc.get("/healthz").json() == {"status": "ok", "detail": {}}
    assert svc.get("/readyz").status_code == 200
    svc.get("/v1/caches/demo/entries", headers=H_READ)
    text = svc.get("/metrics").text
    for name in ("jaxcache_entries", "jaxcache_bytes", "jaxcache_scan_seconds", "jaxcache_prune_deleted_entries",
                 "jaxcache_request_seconds"):
        assert name in text
    assert 'route="/v1/caches/{cache}/entries"' in text


def test_catalog_survives_restart(tmp_path, cache_copy):
    settings = make_settings(tmp_path, {"demo": str(cache_copy)})
    with TestClient(create_app(settings)) as c:
        c.post("/v1/caches/demo/rescan", headers=H_ADMIN)
        c.put("/v1/caches/demo/pins/keepme", headers=H_ADMIN)
    with TestClient(create_app(settings)) as c:
        assert c.get("/readyz").status_code == 200  # ready at once: the catalog was scanned before
        assert [p["pattern"] for p in c.get("/v1/caches/demo/pins", headers=H_READ).json()["pins"]] == ["keepme"]


def test_a_cache_in_each_object_store(tmp_path, store_root, jax_caches):
    """The catalog, a prune and the dashboard over a root in each store: each entry's version is the store's own
    token (GCS's generation also as the integer clients read before versions), and a prune deletes through it."""
    from jaxcache.storage import generation_of, open_storage
    from store_servers import put_dir, raw_names

    put_dir(store_root, jax_caches["zlib"].root)
    storage = open_storage(store_root)
    with TestClient(create_app(make_settings(tmp_path, {"prod": store_root}))) as c:
        assert c.post("/v1/caches/prod/rescan", headers=H_ADMIN).status_code == 200
        got = c.get("/v1/caches/prod/entries?limit=1000", headers=H_READ).json()["entries"]
        assert {e["key"] for e in got} == {e["key"] for e in jax_caches["zlib"].entries}
        for e in got:
            assert e["version"] == storage.stat(e["key"] + "-cache").version and e["version"]
            assert e["generation"] == generation_of(store_root, e["version"])
            assert (e["generation"] is not None) == store_root.startswith("gs://")
        assert {e["compression"] for e in got} == {"zlib"}
        detail = c.get(f"/v1/caches/prod/entries/{got[0]['key']}", headers=H_READ).json()
        assert (detail["version"], detail["generation"]) == (got[0]["version"], got[0]["generation"])
        page = c.get(f"/caches/prod/entries/{got[0]['key']}", headers=H_READ)
        assert page.status_code == 200 and got[0]["version"].strip('"') in page.text
        r = c.post("/v1/caches/prod/prune", headers=H_ADMIN,
                   json={"functions": ["jit_tiny"], "min_age": "0s", "dry_run": False})
        assert r.status_code == 200 and r.json()["deleted"] == 1
        names = raw_names(store_root)
        tiny = next(e for e in jax_caches["zlib"].entries if e["module"] == "jit_tiny")
        assert tiny["file"] not in names and f"{tiny['key']}-atime" not in names
        assert len([n for n in names if n.endswith("-cache")]) == len(jax_caches["zlib"].entries) - 1


def test_zero_values_in_a_policy_are_kept(svc, jax_caches):
    # 0 must not be mistaken for "unset": min_age 0 lifts the grace period, max_total_bytes 0 evicts everything.
    plan = svc.post("/v1/caches/demo/prune", json={"max_total_bytes": 0, "min_age": 0}, headers=H_READ).json()
    assert len(plan["delete"]) == len(jax_caches["zstd"].entries) and plan["bytes_remaining"] == 0
