"""The web dashboard through the ASGI app: pages, auth and the login cookie, CSRF, no off-site URLs, package data,
and every figure equal to the API's."""

from __future__ import annotations

import re
import shutil
import time
import tomllib
import urllib.parse

import msgspec
import pytest
from fastapi.testclient import TestClient

from dashboard_support import (
    ADMIN,
    DASHBOARD,
    DAY,
    EVAL_MISS,
    H_ADMIN,
    H_READ,
    READ,
    REPORT,
    ROOT,
    TORN,
    _keys,
    _pages,
    _record,
    listing,
    parse,
    settings,
    shown_text,
)
from jaxcache import coverage, records
from jaxcache.service.app import create_app
from jaxcache.service.dashboard import format as dfmt
from jaxcache.service.dashboard import site


def test_pages_render_without_javascript(app_client, jax_caches):
    """Every page is complete HTML from the server: the figures are in it, controls are labelled, the skip link
    targets main, and the only assets are this service's own."""
    keys = _keys(jax_caches["zstd"].manifest)
    api = app_client.get("/v1/caches/demo/stats", headers=H_READ).json()
    for url in _pages(keys):
        r = app_client.get(url, headers=H_READ)
        assert r.status_code == 200, (url, r.text[:500])
        assert r.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in r.headers["content-security-policy"]
        page = parse(r.text)
        assert page.headings and page.headings[0], url
        assert '<a class="skip-link" href="#main">' in r.text and '<main id="main"' in r.text
        for control in page.controls:
            assert control.get("id") in page.labels, (url, control)
        for asset in page.assets:
            assert asset.startswith("/static/"), (url, asset)
        assert "/docs" in page.urls
    overview = app_client.get("/caches/demo", headers=H_READ).text
    assert f'data-stat="entries" data-value="{api["entries"]}"' in overview
    assert f'data-stat="size_bytes" data-value="{api["size_bytes"]}"' in overview
    assert dfmt.size(api["size_bytes"]) in overview
    assert 'href="/caches/demo/entries?status=corrupt"' in overview


def test_pages_need_a_token_when_tokens_are_configured(app_client):
    r = app_client.get("/caches/demo/entries?sort=size")
    assert r.status_code == 303
    assert r.headers["location"] == "/login?next=%2Fcaches%2Fdemo%2Fentries%3Fsort%3Dsize"
    assert app_client.get("/login").status_code == 200
    # A bad header token is refused outright (a browser never sends one by itself).
    bad = app_client.get("/caches/demo", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "unknown token" in bad.text
    # A cookie the service no longer accepts goes back to the login form and is dropped.
    app_client.cookies.set(site.COOKIE, "rotated-away")
    r = app_client.get("/caches/demo")
    assert r.status_code == 303 and "expired=1" in r.headers["location"]
    assert site.COOKIE in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
    app_client.cookies.clear()
    # Changing things without a token: 401, as HTML.
    r = app_client.post("/caches/demo/prune", data={"corrupt": "on", "confirm": "demo"})
    assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
    # A report token reads nothing.
    r = app_client.get("/caches/demo", headers={"Authorization": f"Bearer {REPORT}"})
    assert r.status_code == 403


def test_login_sets_a_strict_httponly_cookie(app_client):
    r = app_client.post("/login", data={"token": READ, "next": "/caches/demo/jobs"})
    assert r.status_code == 303 and r.headers["location"] == "/caches/demo/jobs"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{site.COOKIE}={READ};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert app_client.get("/caches/demo/jobs").status_code == 200
    # The API itself does not take the cookie: it wants the header.
    assert app_client.get("/v1/caches/demo/stats").status_code == 401
    # Wrong tokens, report tokens, and redirects off the site.
    assert app_client.post("/login", data={"token": "nope"}).status_code == 401
    r = app_client.post("/login", data={"token": REPORT})
    assert r.status_code == 403 and "read or admin" in r.text
    for evil in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        assert app_client.post("/login", data={"token": READ, "next": evil}).headers["location"] == "/"
    assert app_client.post("/login", data={"token": READ}, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403


def test_open_reads_on_loopback_without_tokens(tmp_path, seeded):
    with TestClient(create_app(settings(tmp_path, seeded, tokens={})), follow_redirects=False) as client:
        client.get("/readyz")
        r = client.get("/caches/demo")
        assert r.status_code == 200 and "anonymous (loopback), read only" in r.text
        r = client.get("/caches/demo/prune?corrupt=on&preview=1")
        assert r.status_code == 200 and "data-apply-denied" in r.text
        before = listing(seeded)
        r = client.post("/caches/demo/prune", data={"corrupt": "on", "min_age": "0s", "confirm": "demo"})
        assert r.status_code == 401
        assert listing(seeded) == before


def test_static_assets_are_served_locally_and_nothing_points_elsewhere(app_client):
    files = [p for p in DASHBOARD.rglob("*") if p.is_file() and p.suffix in (".html", ".css", ".js", ".svg")]
    assert {p.suffix for p in files} >= {".html", ".css", ".js"}
    for path in files:
        text = path.read_text()
        assert not re.search(r"https?://", text), f"{path.relative_to(ROOT)} names a URL on another host"
        assert "//cdn" not in text and "@import" not in text, path
    for name in ("dashboard.css", "dashboard.js"):
        r = app_client.get(f"/static/{name}")
        assert r.status_code == 200 and r.content == (DASHBOARD / "static" / name).read_bytes()
    assert app_client.get("/static/dashboard.css").headers["content-type"].startswith("text/css")
    page = app_client.get("/caches/demo", headers=H_READ).text
    for url in parse(page).urls:
        assert not re.match(r"^[a-z]+:|^//", url), url  # every link and asset is on this site


def test_templates_and_assets_are_package_data():
    """`pip install .` (not only -e) ships every template and asset."""
    config = tomllib.loads((ROOT / "service" / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["packages"]["find"]["include"] == ["jaxcache*"]
    globs = config["package-data"]["jaxcache.service.dashboard"]
    for path in DASHBOARD.rglob("*"):
        if path.is_file() and path.suffix != ".py" and "__pycache__" not in path.parts:
            rel = path.relative_to(DASHBOARD)
            assert any(rel.match(g) for g in globs), f"{rel} is not package data"


def test_prune_apply_needs_admin_confirmation_and_the_form_token(app_client, seeded):
    torn = {f"{TORN}-cache"}
    form = {"corrupt": "on", "min_age": "0s", "confirm": "demo"}
    before = listing(seeded)
    assert torn <= before
    # A read token: 403, and the page says why; nothing deleted.
    app_client.post("/login", data={"token": READ})
    r = app_client.post("/caches/demo/prune", data=form)
    assert r.status_code == 403 and "needs an admin token" in r.text and "Nothing was deleted" in r.text
    # An admin cookie without the form's token (another site's form): 403.
    app_client.post("/login", data={"token": ADMIN})
    assert app_client.post("/caches/demo/prune", data=form).status_code == 403
    preview = app_client.get("/caches/demo/prune?corrupt=on&min_age=0s&preview=1")
    apply_form = preview.text[preview.text.index('class="apply"'):]
    csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', apply_form).group(1)
    assert app_client.post("/caches/demo/prune", data={**form, "csrf": csrf},
                           headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    # No confirmation: 400.
    r = app_client.post("/caches/demo/prune", data={**form, "csrf": csrf, "confirm": "prod"})
    assert r.status_code == 400 and "type the cache name" in r.text
    assert listing(seeded) == before
    # The form token of another cache does not pass either.
    assert csrf != app_client.app.state.dashboard.csrf(site.Viewer("x", "admin", ADMIN, "cookie", True), "prune:x")
    r = app_client.post("/caches/demo/prune", data={**form, "csrf": csrf})
    assert r.status_code == 303 and r.headers["location"].startswith("/caches/demo/prune?applied=")
    assert listing(seeded) == before - torn
    audit = app_client.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"]
    assert audit[0]["deleted"] == 1 and audit[0]["policy"] == {"corrupt": True, "min_age": "0s"}
    page = app_client.get(r.headers["location"])
    assert f'data-applied="{audit[0]["id"]}"' in page.text and f'data-audit="{audit[0]["id"]}"' in page.text


def test_prune_apply_with_the_authorization_header(app_client, seeded, jax_caches):
    """Scripts may post the form with the header instead of the cookie (no form token needed: a browser never
    sends the header cross-site)."""
    tiny = _keys(jax_caches["zstd"].manifest)["jit_tiny"]
    before = listing(seeded)
    data = {"functions": "jit_tiny", "min_age": "0s", "confirm": "demo"}
    assert app_client.post("/caches/demo/prune", data=data, headers=H_READ).status_code == 403
    r = app_client.post("/caches/demo/prune", data=data, headers=H_ADMIN)
    assert r.status_code == 303
    assert listing(seeded) == before - {f"{tiny}-cache", f"{tiny}-atime"}


def test_prune_preview_equals_the_api_dry_run(app_client, seeded):
    before = listing(seeded)
    api = app_client.post("/v1/caches/demo/prune", json={"max_total_bytes": "0", "keep": ["jit_train*"],
                                                          "orphans": True}, headers=H_READ).json()
    r = app_client.get("/caches/demo/prune?max_total_bytes=0&keep=jit_train*&orphans=on&preview=1", headers=H_READ)
    assert r.status_code == 200
    for field in ("bytes_freed", "bytes_remaining", "kept", "entries_total"):
        assert f'data-stat="{field}" data-value="{api[field]}"' in r.text, field
    assert f'data-stat="delete" data-value="{len(api["delete"])}"' in r.text
    for d in api["delete"]:
        assert f'data-key="{d["key"]}"' in r.text
    assert api["protected"] and all(f'data-key="{p["key"]}"' in r.text for p in api["protected"])
    assert any("pinned" in reason or "keep" in reason for p in api["protected"] for reason in p["reasons"])
    assert listing(seeded) == before
    bad = app_client.get("/caches/demo/prune?unused_for=soon&preview=1", headers=H_READ)
    assert bad.status_code == 400 and "is not a duration" in bad.text
    none = app_client.get("/caches/demo/prune?min_age=0s&preview=1", headers=H_READ)
    assert none.status_code == 400 and "selects nothing" in none.text


def test_errors_are_pages(app_client):
    assert app_client.get("/caches/nope", headers=H_READ).status_code == 404
    r = app_client.get("/caches/demo/entries/not-a-key", headers=H_READ)
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    assert app_client.get(f"/caches/demo/entries/jit_x-{'0' * 64}", headers=H_READ).status_code == 404
    assert app_client.get("/caches/demo/jobs/nobody", headers=H_READ).status_code == 404
    r = app_client.get("/caches/demo/entries?cursor=garbage", headers=H_READ)
    assert r.status_code == 400 and "cursor" in r.text
    assert app_client.get("/caches/demo/entries?min_size=lots", headers=H_READ).status_code == 400


def test_a_job_without_misses_says_so_once(app_client, seeded, jax_caches):
    """A job whose every program was in the cache says "No misses" in one place; a job with misses lists them by
    cause, with the fix."""
    train = _keys(jax_caches["zstd"].manifest)["jit_train_step"]
    at = time.time() - 60
    hit = records.KeyUsage(key=train, event=records.HIT, hits=2, retrieval_s=0.1, first_at=at - 10, last_at=at)
    record = _record("llm-serve", "serve-1", [hit], at=at)
    (seeded / record.name).parent.mkdir(parents=True, exist_ok=True)
    (seeded / record.name).write_bytes(record.to_json())
    assert app_client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
    served = app_client.get("/v1/caches/demo/jobs/llm-serve", headers=H_READ).json()
    assert served["hits"] == 2 and served["missed"] == []
    page = app_client.get("/caches/demo/jobs/llm-serve", headers=H_READ).text
    assert page.count("No misses") == 1
    assert "Misses" in parse(page).headings
    evaluation = app_client.get("/caches/demo/jobs/llm-eval", headers=H_READ).text
    assert "No misses" not in evaluation and f'data-key="{EVAL_MISS}"' in evaluation
    assert {"Why it missed", "Misses"} <= set(parse(evaluation).headings)


def test_entries_page_rows_equal_the_api(app_client):
    for query in ("sort=size&order=desc&limit=4", "function=jit_*&sort=hits&order=desc", "status=corrupt",
                  "job=llm-eval", "min_size=2000&sort=created"):
        api = app_client.get(f"/v1/caches/demo/entries?{query}", headers=H_READ).json()
        page = app_client.get(f"/caches/demo/entries?{query}", headers=H_READ).text
        shown = re.findall(r'<tr data-key="([^"]+)"', page)
        assert shown == [e["key"] for e in api["entries"]], query
        if api["next_cursor"]:
            assert "cursor=" in page and 'rel="next"' in page


def test_stats_by_function_saved_sums_the_entries(app_client):
    stats = app_client.get("/v1/caches/demo/stats", headers=H_READ).json()
    entries = app_client.get("/v1/caches/demo/entries?limit=1000", headers=H_READ).json()["entries"]
    expected: dict[str, float] = {}
    for e in entries:
        if e["saved_s"] > 0:
            expected[e["function"]] = expected.get(e["function"], 0.0) + e["saved_s"]
    got = {f["function"]: f["saved_s"] for f in stats["by_function_saved"]}
    assert got == pytest.approx(expected) and got
    assert [f["saved_s"] for f in stats["by_function_saved"]] == sorted(got.values(), reverse=True)


def test_warmups_pages_show_ingested_coverage_records(app_client, seeded, jax_caches):
    r = app_client.get("/caches/demo/warmups", headers=H_READ)
    assert r.status_code == 200 and "No warm-ups recorded" in r.text
    assert app_client.get("/caches/demo/warmups/w1", headers=H_READ).status_code == 404
    key = _keys(jax_caches["zstd"].manifest)["jit_train_step"]
    record = coverage.WarmupRecord(
        id="w1", job="llm-pretrain", topology="4x8x1", platform="gpu", gpu_model="NVIDIA H100",
        started_at=time.time() - 120, finished_at=time.time() - 60, cache_dir=str(seeded),
        fingerprint=records.Fingerprint(jax="0.10.2", jaxlib="0.10.2"),
        programs=(coverage.ProgramCoverage(key, "jit_train_step", coverage.WRITTEN, 4.5, 1000),
                  coverage.ProgramCoverage(EVAL_MISS, "jit_eval_step", coverage.PRESENT)))
    (seeded / record.name).parent.mkdir(parents=True, exist_ok=True)
    (seeded / record.name).write_bytes(record.to_json())
    assert app_client.post("/v1/caches/demo/rescan", headers=H_ADMIN).json()["warmups_ingested"] == 1
    api = app_client.get("/v1/caches/demo/warmups", headers=H_READ).json()["warmups"]
    page = app_client.get("/caches/demo/warmups", headers=H_READ).text
    assert 'data-warmup="w1"' in page and "NVIDIA H100" in page and "4x8x1" in page
    assert f'data-value="{api[0]["hit_since"]}"' in page
    page = app_client.get("/caches/demo/warmups/w1", headers=H_READ).text
    assert f'href="/caches/demo/entries/{key}"' in page and "jit_eval_step" in page


def test_formats_and_the_growth_chart():
    assert [dfmt.age(s) for s in (0, 59, 61, 3600, 3660, 90061, 10 * DAY + 18)] == [
        "0s", "59s", "1m 1s", "1h", "1h 1m", "1d 1h", "10d"]
    assert (dfmt.size(1536), dfmt.size(None), dfmt.rate(0.9166), dfmt.rate(None)) == ("1.5 KiB", "–", "91.7 %", "–")
    assert [dfmt.seconds(s) for s in (0, 4.25, 90, 7200, 3 * DAY)] == ["0 s", "4.2 s", "1.5 min", "2.0 h", "3.0 d"]
    assert dfmt.short_key("jit_f-" + "a" * 64) == "jit_f-aaaaaaaa…"
    today = dfmt.datetime(2026, 11, 30).date()
    chart = dfmt.growth_chart([{"day": "2026-11-28", "entries": 1, "size_bytes": 100},
                               {"day": "2026-11-30", "entries": 2, "size_bytes": 50}], 1000, today=today)
    assert len(chart.bars) == 30 and chart.bars[0].day == "2026-11-01" and chart.bars[-1].day == "2026-11-30"
    held = {b.day: b.total_bytes for b in chart.bars}
    assert (held["2026-11-01"], held["2026-11-27"], held["2026-11-28"], held["2026-11-29"], held["2026-11-30"]) == (
        850, 850, 950, 950, 1000)
    assert chart.y_max_bytes == 1000 and [b.entries for b in chart.bars if b.entries] == [1, 2]


def test_overview_and_entry_pages_show_integrity_as_the_api_does(app_client, seeded):
    assert app_client.post("/v1/caches/demo/verify", json={"recheck_all": True}, headers=H_ADMIN).status_code == 200
    api = app_client.get("/v1/caches/demo/integrity", headers=H_READ).json()
    page = app_client.get("/caches/demo", headers=H_READ).text
    for cls, n in api["counts"].items():
        assert f'data-stat="integrity-{cls}" data-value="{n}"' in page, cls
    # The torn entry holds its key up: JAX never overwrites it, so no job gets a good entry until it is removed.
    held = [p["key"] for p in api["problems"] if p["held_up"]]
    assert held and api["held_up"] == len(held) and f'data-held-up="{len(held)}"' in page
    assert all(f'<tr data-key="{k}" data-held-up="1">' in page for k in held)
    key = next(p.name.removesuffix("-cache") for p in sorted(seeded.glob("*-cache")))
    detail = app_client.get(f"/v1/caches/demo/entries/{key}", headers=H_READ).json()
    entry_page = app_client.get(f"/caches/demo/entries/{key}", headers=H_READ).text
    assert f'class="status-{detail["integrity"]}">{detail["integrity"]}</span>' in entry_page


def _shown(page: str) -> str:
    return shown_text(page, "\n")


def test_names_that_would_display_as_others_are_shown_escaped(tmp_path, seeded, jax_caches):
    """A real entry under a name with bidi overrides (`jit_‮evil‭` displays as `jit_live`): every page shows its
    function and key with those characters escaped, as the API's exact value stays in links and data attributes."""
    tiny = _keys(jax_caches["zstd"].manifest)["jit_tiny"]
    key = "jit_\u202eevil\u202d-" + tiny.rsplit("-", 1)[1]
    for suffix in ("-cache", "-atime"):
        shutil.copy2(seeded / f"{tiny}{suffix}", seeded / f"{key}{suffix}")
    escaped = "jit_\\u202eevil\\u202d"
    with TestClient(create_app(settings(tmp_path, seeded)), follow_redirects=False) as client:
        assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
        assert client.get(f"/v1/caches/demo/entries/{urllib.parse.quote(key)}", headers=H_READ).json()["key"] == key
        for url in ("/caches/demo", "/caches/demo/entries?limit=200", f"/caches/demo/entries/{urllib.parse.quote(key)}",
                    "/caches/demo/prune?functions=jit_*&min_age=0s&preview=1"):
            r = client.get(url, headers=H_READ)
            assert r.status_code == 200, (url, r.text[:500])
            shown = _shown(r.text)
            assert escaped in shown, url
            assert "\u202e" not in shown and "\u202d" not in shown, url
            assert f'="{key}"' in r.text or f'="{key[:-65]}"' in r.text, url  # data-key, data-copy, data-function


def test_pages_escape_names_as_the_cli_does():
    # One escaping for the dashboard and the CLI (jaxcache.display.shown): invisible characters and backslashes.
    from jaxcache.display import shown

    assert dfmt.visible is shown
    assert dfmt.visible("jit_ok.v2-é中") == "jit_ok.v2-é中"
    assert dfmt.visible("jit_\u202eevil\u202d") == "jit_\\u202eevil\\u202d"
    assert dfmt.short_key("jit_\u202ef-" + "a" * 64) == "jit_\\u202ef-aaaaaaaa…"

def test_an_entry_a_warm_up_wrote_links_to_that_warm_up(app_client, seeded, jax_caches):
    """A warm-up is not a job (no job page): the entry's first writer links to the warm-up's page, which answers."""
    tiny = _keys(jax_caches["zstd"].manifest)["jit_tiny"]
    key = "jit_warmed-" + tiny.rsplit("-", 1)[1]  # a real entry that only the warm-up wrote
    for suffix in ("-cache", "-atime"):
        shutil.copy2(seeded / f"{tiny}{suffix}", seeded / f"{key}{suffix}")
    now = time.time()
    run = msgspec.structs.replace(
        _record("demo-warmup", "warm-run", [records.KeyUsage(key=key, event=records.WRITE, compiles=1, writes=1,
                                                             compile_s=0.5, first_at=now - 60, last_at=now - 60)],
                at=now - 60),
        kind=records.WARMUP)
    warm = coverage.WarmupRecord(
        id="w-demo", job="demo-warmup", topology="1x1x1", platform="cpu", started_at=now - 120, finished_at=now - 50,
        cache_dir=str(seeded), fingerprint=records.Fingerprint(jax="0.10.2", jaxlib="0.10.2"),
        programs=(coverage.ProgramCoverage(key, "jit_warmed", coverage.WRITTEN, 0.5, 1000),))
    for name, data in ((run.name, run.to_json()), (warm.name, warm.to_json())):
        (seeded / name).parent.mkdir(parents=True, exist_ok=True)
        (seeded / name).write_bytes(data)
    assert app_client.post("/v1/caches/demo/rescan", headers=H_ADMIN).json()["records_ingested"] == 1
    writer = app_client.get(f"/v1/caches/demo/entries/{key}", headers=H_READ).json()["first_writer"]
    assert writer["job"] == "demo-warmup", writer
    page = app_client.get(f"/caches/demo/entries/{key}", headers=H_READ).text
    links = re.findall(r'data-field="writer.job"><a href="([^"]+)">', page)
    assert links == ["/caches/demo/warmups/w-demo"], links
    assert app_client.get(links[0], headers=H_READ).status_code == 200
    assert app_client.get("/caches/demo/jobs/demo-warmup", headers=H_READ).status_code == 404  # not a job
    # A job's write still links to its job page.
    train = _keys(jax_caches["zstd"].manifest)["jit_train_step"]
    page = app_client.get(f"/caches/demo/entries/{train}", headers=H_READ).text
    assert re.findall(r'data-field="writer.job"><a href="([^"]+)">', page) == ["/caches/demo/jobs/llm-pretrain"]
