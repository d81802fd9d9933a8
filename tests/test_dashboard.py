"""The web dashboard: in a real browser (Playwright driving Debian's Chromium) over `jaxcache serve` on a loopback
port, and through the ASGI app for what needs no browser.

The cache is a copy of the session's real JAX entries (``jax_caches``), plus one torn entry (a real entry's bytes
cut short, as a crashed writer leaves it) and one orphaned ``-atime`` file, with run records of three runs of two
jobs naming the real keys, written where the client writes them so the service ingests them on its first scan.
Screenshots of every page are saved under ``bench/out/screenshots/`` (or ``$JAXCACHE_SCREENSHOTS``); the path is
printed at the end of the run.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import shutil
import socket
import time
import tomllib
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from conftest import SCREENSHOTS_KEY, serve_env, start_serve, stop_serve, wait_ready
from jaxcache import coverage, records
from jaxcache import entry as fmt
from jaxcache.records import Fingerprint, KeyUsage, RunRecord
from jaxcache.service.app import create_app
from jaxcache.service.dashboard import format as dfmt
from jaxcache.service.dashboard import site
from jaxcache.service.settings import ServiceSettings

ROOT = Path(__file__).parent.parent
DASHBOARD = ROOT / "service" / "jaxcache" / "service" / "dashboard"
READ, ADMIN, REPORT = "dash-read-token", "dash-admin-token", "dash-report-token"
H_READ, H_ADMIN = {"Authorization": f"Bearer {READ}"}, {"Authorization": f"Bearer {ADMIN}"}
DAY = 86400.0
CHROMIUM = os.environ.get("JAXCACHE_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(os.environ.get("JAXCACHE_SCREENSHOTS") or ROOT / "bench" / "out" / "screenshots")
TORN = "jit_torn-" + hashlib.sha256(b"torn").hexdigest()
ORPHAN = "jit_gone-" + hashlib.sha256(b"gone").hexdigest()
EVAL_MISS = "jit_eval_step-" + hashlib.sha256(b"eval").hexdigest()


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


TOKENS = {sha(READ): "read", sha(ADMIN): "admin", sha(REPORT): "report"}


# --- the cache: real entries, a torn one, an orphan, run records ---------------------------------------------


def _keys(manifest: dict) -> dict[str, str]:
    return {e["module"]: e["key"] for e in manifest["entries"]}


def _record(job: str, run_id: str, keys: list[KeyUsage], *, at: float, process_index: int = 0,
            process_count: int = 1, topology: str = "1x1x1") -> RunRecord:
    return RunRecord(
        job=job, run_id=run_id, process_index=process_index, process_count=process_count, host=f"node-{process_index}",
        started_at=at - 120, updated_at=at, topology=topology, final=True, keys=keys,
        fingerprint=Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="cpu", compression="zstandard"),
    )


def seed_cache(dst: Path, manifest: dict, *, now: float) -> Path:
    """Age the copied entries 10 days, add a torn entry and an orphan, and write the jobs' run records."""
    t = now - 10 * DAY
    for p in dst.iterdir():
        if p.is_file():
            if p.name.endswith("-atime"):
                p.write_bytes(fmt.encode_atime(int(t * 1e9)))
            os.utime(p, (t, t))
    keys = _keys(manifest)
    train, tiny, odd = keys["jit_train_step"], keys["jit_tiny"], keys["jit_odd-name.v2"]
    whole = (dst / f"{train}-cache").read_bytes()
    (dst / f"{TORN}-cache").write_bytes(whole[:6])  # a writer that died early in the write
    (dst / f"{ORPHAN}-atime").write_bytes(fmt.encode_atime(int(t * 1e9)))
    for name in (f"{TORN}-cache", f"{ORPHAN}-atime"):
        os.utime(dst / name, (now - 2 * DAY, now - 2 * DAY))

    def write(key: str, compile_s: float, at: float) -> KeyUsage:
        return KeyUsage(key=key, event=records.WRITE, compiles=1, writes=1, compile_s=compile_s, first_at=at,
                        last_at=at)

    def hit(key: str, n: int, at: float) -> KeyUsage:
        return KeyUsage(key=key, event=records.HIT, hits=n, retrieval_s=0.05 * n, first_at=at - 10, last_at=at)

    first = now - 3 * DAY
    runs = [
        _record("llm-pretrain", "pre-1",
                [write(k, 4.5 if k == train else 0.25, first) for k in sorted(e["key"] for e in manifest["entries"])],
                at=first),
        *(_record("llm-pretrain", "pre-2", [hit(train, 3, now - 3600), hit(tiny, 1, now - 3600)], at=now - 3600,
                  process_index=i, process_count=2, topology="1x2x1") for i in range(2)),
        _record("llm-eval", "eval-1",
                [hit(train, 2, now - 7200), hit(odd, 1, now - 7200),
                 KeyUsage(key=EVAL_MISS, event=records.COMPILED, function="jit_eval_step", compiles=1,
                          compile_s=2.5, reason="compile time below the threshold", first_at=now - 7300,
                          last_at=now - 7300)],
                at=now - 7200),
    ]
    for r in runs:
        path = dst / r.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(r.to_json())
    return dst


def listing(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_file()}


@pytest.fixture
def seeded(tmp_path, jax_caches) -> Path:
    dst = tmp_path / "cache"
    shutil.copytree(jax_caches["zstd"].root, dst)
    return seed_cache(dst, jax_caches["zstd"].manifest, now=time.time())


# --- through the ASGI app ----------------------------------------------------------------------------------------


def settings(tmp_path: Path, root: Path, **kw) -> ServiceSettings:
    kw.setdefault("tokens", TOKENS)
    return ServiceSettings(caches={"demo": str(root)}, db=f"sqlite:///{tmp_path / 'catalog.sqlite'}", rescan_s=3600,
                           **kw)


@pytest.fixture
def app_client(tmp_path, seeded):
    with TestClient(create_app(settings(tmp_path, seeded)), follow_redirects=False) as client:
        assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
        yield client


class _Page(html.parser.HTMLParser):
    """What the tests check in a page: controls and their labels, asset URLs, every URL, headings."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[dict] = []
        self.labels: set[str] = set()
        self.assets: list[str] = []
        self.urls: list[str] = []
        self.headings: list[str] = []
        self._heading: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("input", "select", "textarea") and a.get("type") != "hidden":
            self.controls.append(a)
        if tag == "label" and a.get("for"):
            self.labels.add(a["for"])
        if tag in ("script", "link", "img") and (a.get("src") or a.get("href")):
            self.assets.append(a.get("src") or a.get("href"))
        for name in ("href", "src", "action"):
            if a.get(name):
                self.urls.append(a[name])
        if tag in ("h1", "h2", "h3"):
            self._heading = []

    def handle_data(self, data):
        if self._heading is not None:
            self._heading.append(data)

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3") and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            self._heading = None


def parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def _pages(keys: dict[str, str]) -> list[str]:
    return ["/", "/caches/demo", "/caches/demo/entries", "/caches/demo/entries?sort=size&order=desc&limit=5",
            f"/caches/demo/entries/{keys['jit_train_step']}", "/caches/demo/jobs", "/caches/demo/jobs/llm-eval",
            "/caches/demo/warmups", "/caches/demo/prune", "/caches/demo/prune?functions=jit_tiny&preview=1"]


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


# --- in a real browser ------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, base: str, root: Path) -> None:
        self.base, self.root = base, root
        self.api = httpx.Client(base_url=base, headers=H_READ, timeout=30)

    def get(self, path: str) -> dict:
        r = self.api.get(path)
        assert r.status_code == 200, r.text
        return r.json()


def _serve(tmp_path: Path, root: Path):
    proc, base = start_serve({"demo": root}, f"sqlite:///{tmp_path / 'served.sqlite'}",
                             env=serve_env(JAXCACHE_TOKENS=json.dumps(TOKENS)))
    try:
        wait_ready(proc, base)
        served = Served(base, root)
        yield served
        served.api.close()
    finally:
        stop_serve(proc)


@pytest.fixture(scope="module")
def served(tmp_path_factory, jax_caches):
    """One service for the read-only browser tests."""
    tmp = tmp_path_factory.mktemp("dash-served")
    root = tmp / "cache"
    shutil.copytree(jax_caches["zstd"].root, root)
    seed_cache(root, jax_caches["zstd"].manifest, now=time.time())
    yield from _serve(tmp, root)


@pytest.fixture
def served_fresh(tmp_path, seeded):
    """A service of its own, for tests that delete."""
    yield from _serve(tmp_path, seeded)


@pytest.fixture(scope="module")
def browser(request):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is missing: pip install -e '.[dev]'")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium package where it can "
                    "(apt-get, as root or with sudo); set JAXCACHE_CHROMIUM to use another")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    request.config.stash[SCREENSHOTS_KEY] = SCREENSHOTS
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    # Script errors and refusals (a Content-Security-Policy violation would show here); not HTTP statuses.
    pg.on("console", lambda msg: errors.append(msg.text)
          if msg.type == "error" and not msg.text.startswith("Failed to load resource") else None)
    yield pg
    context.close()
    assert not errors, errors


def shot(page, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def login(page, base: str, token: str, path: str = "/") -> None:
    page.goto(base + path)
    assert "/login" in page.url
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(re.escape(base + path) + "$"))


def value(page, selector: str) -> str:
    return page.locator(selector).first.get_attribute("data-value")


def _same(shown: str, api) -> bool:
    if api is None:
        return shown == ""
    return float(shown) == pytest.approx(float(api))


@pytest.mark.slow
def test_browser_overview_numbers_equal_the_api(served, page):
    page.goto(served.base + "/")
    page.wait_for_url(re.compile(r"/login\?next=%2F$"))
    shot(page, "01-login")
    login(page, served.base, READ)
    assert page.locator("tr[data-cache=demo]").count() == 1
    shot(page, "02-caches")
    page.get_by_role("link", name="demo", exact=True).first.click()
    page.wait_for_url(served.base + "/caches/demo")
    api = served.get("/v1/caches/demo/stats")
    for field in ("entries", "size_bytes", "compile_seconds", "corrupt", "orphans", "bytes_per_day"):
        assert _same(value(page, f'[data-stat="{field}"]'), api[field]), field
    for window in ("last_24h", "last_7d"):
        for field in ("hit_rate", "saved_s", "hits", "misses", "jobs", "processes"):
            assert _same(value(page, f'[data-stat="{window}.{field}"]'), api[window][field]), (window, field)
    assert page.locator('[data-stat="size_bytes"]').inner_text().strip() == dfmt.size(api["size_bytes"])
    assert page.locator('[data-stat="last_24h.hit_rate"]').inner_text().strip() == dfmt.rate(
        api["last_24h"]["hit_rate"])
    assert api["last_24h"]["hits"] > 0 and api["last_7d"]["misses"] > api["last_24h"]["misses"] >= 0
    top = page.locator('table[data-table="by_function"] tbody tr')
    assert [top.nth(i).get_attribute("data-function") for i in range(top.count())] == [
        f["function"] for f in api["by_function"][:10]]
    saved = page.locator('table[data-table="by_function_saved"] tbody tr')
    assert [saved.nth(i).get_attribute("data-function") for i in range(saved.count())] == [
        f["function"] for f in api["by_function_saved"][:10]]
    assert api["by_function_saved"][0]["function"] == "jit_train_step"
    assert page.locator("svg.growth rect.bar").count() == 30
    shot(page, "03-overview")
    # The corrupt count links to the filtered entries list.
    page.locator('[data-stat="corrupt"] a').click()
    page.wait_for_url(re.compile(r"/caches/demo/entries\?status=corrupt$"))
    assert page.locator("tr[data-key]").evaluate_all("rows => rows.map(r => r.dataset.key)") == [TORN]
    # Keyboard: the first Tab lands on the skip link, which moves focus to the main content.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip-link"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"


@pytest.mark.slow
def test_browser_entries_filter_sort_page_and_open_one(served, page, jax_caches):
    login(page, served.base, READ, "/caches/demo/entries")

    def shown() -> list[str]:
        return page.locator("table[data-table=entries] tbody tr[data-key]").evaluate_all(
            "rows => rows.map(r => r.dataset.key)")

    api = served.get("/v1/caches/demo/entries?limit=50")
    assert shown() == [e["key"] for e in api["entries"]]
    shot(page, "04-entries")
    # Filter by function glob with the form.
    page.get_by_label("Function (glob)").fill("jit_convert*")
    page.get_by_role("button", name="Apply filters").click()
    page.wait_for_url(re.compile(r"function=jit_convert"))
    api = served.get("/v1/caches/demo/entries?function=jit_convert*&limit=50")
    assert shown() == [e["key"] for e in api["entries"]] and len(api["entries"]) >= 2
    # Sort by clicking the Size header: largest first, the filter kept.
    page.locator("th a[data-sort=size]").click()
    page.wait_for_url(re.compile(r"sort=size&order=desc"))
    api = served.get("/v1/caches/demo/entries?function=jit_convert*&sort=size&order=desc&limit=50")
    assert shown() == [e["key"] for e in api["entries"]]
    assert page.locator("th[aria-sort=descending]").count() == 1
    # The sort menus, with the keyboard: by hits, ascending, no function filter.
    page.get_by_label("Function (glob)").fill("")
    page.get_by_label("Sort by").select_option("hits")
    page.get_by_label("Order").select_option("asc")
    page.get_by_role("button", name="Apply filters").focus()
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"sort=hits&order=asc"))
    api = served.get("/v1/caches/demo/entries?sort=hits&order=asc&limit=50")
    assert shown() == [e["key"] for e in api["entries"]]
    # Paging with the cursor, 5 a page, through to the end: the API's order, no duplicates or gaps.
    page.goto(served.base + "/caches/demo/entries?sort=size&order=desc&limit=5")
    seen: list[str] = []
    for _ in range(20):
        seen += shown()
        nxt = page.get_by_role("link", name="Next page")
        if nxt.count() == 0:
            break
        with page.expect_navigation():
            nxt.click()
    everything = served.get("/v1/caches/demo/entries?sort=size&order=desc&limit=1000")["entries"]
    assert seen == [e["key"] for e in everything]
    # Open an entry.
    train = _keys(jax_caches["zstd"].manifest)["jit_train_step"]
    page.goto(served.base + "/caches/demo/entries?function=jit_train_step")
    page.get_by_role("link", name="jit_train_step", exact=True).click()
    page.wait_for_url(served.base + f"/caches/demo/entries/{train}")
    e = served.get(f"/v1/caches/demo/entries/{train}")
    assert page.locator('[data-field="key"]').inner_text() == train
    assert value(page, '[data-field="size_bytes"]') == str(e["size_bytes"])
    assert page.locator('[data-field="compression"]').inner_text() == e["compression"] == "zstd"
    assert _same(value(page, '[data-field="compile_seconds"]'), e["compile_seconds"])
    assert _same(value(page, '[data-field="measured_compile_s"]'), e["measured_compile_s"])
    assert value(page, '[data-field="hits"]') == str(e["hits"]) == "8"
    assert _same(value(page, '[data-field="saved_s"]'), e["saved_s"])
    assert page.locator('[data-field="writer.job"]').inner_text() == e["first_writer"]["job"] == "llm-pretrain"
    assert page.locator('[data-field="writer.topology"]').inner_text() == "1x1x1"
    assert page.locator('[data-field="writer.jaxlib"]').inner_text() == "0.10.2 / 0.10.2"
    rows = page.locator("table[data-table=entry_jobs] tbody tr[data-job]")
    assert rows.evaluate_all("rows => rows.map(r => r.dataset.job)") == [j["job"] for j in e["jobs"]]
    shot(page, "05-entry")


@pytest.mark.slow
def test_browser_jobs_numbers_equal_the_api(served, page):
    login(page, served.base, READ, "/caches/demo/jobs")
    api = served.get("/v1/caches/demo/jobs")["jobs"]
    rows = page.locator("table[data-table=jobs] tbody tr[data-job]")
    assert rows.evaluate_all("rows => rows.map(r => r.dataset.job)") == [j["job"] for j in api]
    fields = ("hit_rate", "hits", "misses", "writes", "saved_s", "compile_s", "runs", "processes")
    for j in api:
        cells = page.locator(f'tr[data-job="{j["job"]}"] td[data-value]').evaluate_all(
            "cells => cells.map(c => c.dataset.value)")
        for shown, field in zip(cells, fields, strict=False):
            assert _same(shown, j[field]), (j["job"], field)
        assert _same(cells[len(fields)], j["last_run_s"])
    shot(page, "06-jobs")
    page.get_by_role("link", name="llm-eval", exact=True).click()
    page.wait_for_url(served.base + "/caches/demo/jobs/llm-eval")
    detail = served.get("/v1/caches/demo/jobs/llm-eval")
    for field in fields:
        assert _same(value(page, f'[data-stat="{field}"]'), detail[field]), field
    missed = page.locator("table[data-table=missed] tbody tr[data-key]")
    assert missed.evaluate_all("rows => rows.map(r => r.dataset.key)") == [m["key"] for m in detail["missed"]]
    assert [m["key"] for m in detail["missed"]] == [EVAL_MISS]
    assert "compile time below the threshold" in missed.first.inner_text()
    shot(page, "07-job")


@pytest.mark.slow
def test_browser_warmups_page(served, page):
    login(page, served.base, READ, "/caches/demo/warmups")
    assert page.get_by_text("No warm-ups recorded for this cache.").is_visible()
    assert page.get_by_role("heading", name="Warm-ups", exact=True).is_visible()
    shot(page, "08-warmups")


@pytest.mark.slow
def test_browser_prune_preview_then_apply_as_admin(served_fresh, page, jax_caches):
    base, root = served_fresh.base, served_fresh.root
    tiny = _keys(jax_caches["zstd"].manifest)["jit_tiny"]
    login(page, base, ADMIN, "/caches/demo/prune")
    page.get_by_label("Functions").fill("jit_tiny")
    page.get_by_label("Corrupt entries").check()
    page.get_by_label("Keep (keys or globs)").fill("jit_torn*")
    page.get_by_label("Minimum age").fill("0s")
    page.get_by_role("button", name="Preview (dry run)").click()
    page.wait_for_selector("[data-preview]")
    api = served_fresh.api.post("/v1/caches/demo/prune", json={
        "functions": ["jit_tiny"], "corrupt": True, "keep": ["jit_torn*"], "min_age": "0s"}).json()
    for field in ("bytes_freed", "bytes_remaining", "kept", "entries_total"):
        assert _same(value(page, f'[data-stat="{field}"]'), api[field]), field
    goes = page.locator("table[data-table=delete] tbody tr[data-key]")
    assert goes.evaluate_all("rows => rows.map(r => r.dataset.key)") == [d["key"] for d in api["delete"]] == [tiny]
    kept = page.locator("table[data-table=protected] tbody tr[data-key]")
    assert kept.evaluate_all("rows => rows.map(r => r.dataset.key)") == [TORN]
    assert "jit_torn*" in kept.first.inner_text()  # why it is protected
    before = listing(root)
    assert listing(root) == before and f"{tiny}-cache" in before
    # The apply button waits for the cache name.
    apply = page.get_by_role("button", name=re.compile(r"^Delete 1 entry"))
    assert apply.is_disabled()
    page.get_by_label(re.compile("Type the cache name")).fill("dem")
    assert apply.is_disabled()
    page.get_by_label(re.compile("Type the cache name")).fill("demo")
    assert apply.is_enabled()
    shot(page, "09-prune-preview")
    apply.click()
    page.wait_for_selector("[data-applied]")
    assert listing(root) == before - {f"{tiny}-cache", f"{tiny}-atime"}
    audit = served_fresh.get("/v1/caches/demo/prunes")["prunes"]
    assert len(audit) == 1 and audit[0]["deleted"] == 1
    assert page.locator('[data-applied] [data-field="deleted"]').get_attribute("data-value") == "1"
    assert page.locator(f'tr[data-audit="{audit[0]["id"]}"]').is_visible()
    shot(page, "10-prune-applied")


@pytest.mark.slow
def test_browser_read_token_cannot_apply(served_fresh, page):
    base, root = served_fresh.base, served_fresh.root
    login(page, base, READ, "/caches/demo/prune?corrupt=on&min_age=0s&preview=1")
    assert page.locator("table[data-table=delete] tbody tr[data-key]").count() == 1
    denied = page.locator("[data-apply-denied]")
    assert denied.is_visible() and "needs an admin token" in denied.inner_text()
    assert "read token" in denied.inner_text()
    assert page.locator("form.apply").count() == 0
    shot(page, "11-prune-read-token")
    before = listing(root)
    # Posting an apply form anyway (the browser sends its cookie) is refused, and the page says so.
    with page.expect_navigation() as nav:
        page.evaluate("""() => {
            const f = document.createElement("form");
            f.method = "post";
            f.action = "/caches/demo/prune";
            for (const [k, v] of [["corrupt", "on"], ["min_age", "0s"], ["confirm", "demo"]]) {
                const i = document.createElement("input");
                i.type = "hidden"; i.name = k; i.value = v; f.appendChild(i);
            }
            document.body.appendChild(f);
            f.submit();
        }""")
    assert nav.value.status == 403
    assert "needs an admin token" in page.locator("[data-error]").inner_text()
    assert "Nothing was deleted" in page.locator("[data-error]").inner_text()
    shot(page, "12-prune-refused")
    assert listing(root) == before
    assert served_fresh.get("/v1/caches/demo/prunes")["prunes"] == []


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
    key = next(p.name.removesuffix("-cache") for p in sorted(seeded.glob("*-cache")))
    detail = app_client.get(f"/v1/caches/demo/entries/{key}", headers=H_READ).json()
    entry_page = app_client.get(f"/caches/demo/entries/{key}", headers=H_READ).text
    assert f'class="status-{detail["integrity"]}">{detail["integrity"]}</span>' in entry_page
