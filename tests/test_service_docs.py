"""The API's docs pages, /docs (Swagger UI) and /redoc, from assets in a Python package: nothing from another host,
so they work on an air-gapped cluster; and in a real browser, Authorize then "Try it out" with a bearer token."""

from __future__ import annotations

import html.parser
import os
import re
import tomllib

import pytest
from fastapi.testclient import TestClient

from conftest import jaxcache_serve
from dashboard_support import CHROMIUM, ROOT
from jaxcache.service.app import create_app
from jaxcache.service.web import docs
from reports_support import H_READ, READ
from reports_support import settings as service_settings

ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
#: ReDoc's footer shows Redocly's logo from their CDN (the URL is fixed in its bundle, which hides the image when it
#: fails to load): the pages' Content-Security-Policy blocks it, so the browser never asks that host.
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


class _Urls(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href", "spec-url") and v]


def _urls(page: str) -> list[str]:
    parser = _Urls()
    parser.feed(page)
    return parser.urls


@pytest.fixture
def client(tmp_path, cache_copy):
    with TestClient(create_app(service_settings(tmp_path, {"demo": str(cache_copy)}))) as c:
        yield c


@pytest.mark.parametrize(("page", "needs"), [("/docs", {"/docs/assets/swagger-ui-bundle.js",
                                                        "/docs/assets/swagger-ui.css"}),
                                             ("/redoc", {"/docs/assets/redoc.standalone.js", "/openapi.json"})])
def test_docs_pages_load_only_this_services_assets(client, page, needs):
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?://|//cdn|fonts\.googleapis", r.text), "a URL on another host"
    urls = _urls(r.text)
    assert needs <= set(urls) and all(u.startswith("/") and not u.startswith("//") for u in urls), urls
    assert "'/openapi.json'" in r.text or "/openapi.json" in urls
    # Whatever the bundles try at run time, the browser fetches nothing from elsewhere.
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "http" not in csp
    for url in urls:
        asset = client.get(url)
        assert asset.status_code == 200 and asset.content, url


def test_docs_assets_are_the_packaged_files(client):
    for name in ASSETS:
        r = client.get(f"{docs.ASSETS_PATH}/{name}")
        assert r.status_code == 200 and r.content == (docs.ASSETS / name).read_bytes(), name
    assert client.get(f"{docs.ASSETS_PATH}/swagger-ui-bundle.js").headers["content-type"].startswith("text/javascript")
    assert client.get(f"{docs.ASSETS_PATH}/swagger-ui.css").headers["content-type"].startswith("text/css")
    # Swagger UI 5 reads OpenAPI 3.1 (the version FastAPI writes); 4 shows "unable to render this definition".
    bundle = (docs.ASSETS / "swagger-ui-bundle.js").read_text(errors="replace")
    assert re.search(r'"5\.\d+\.\d+"', bundle) and client.get("/openapi.json").json()["openapi"].startswith("3.1")
    service = tomllib.loads((ROOT / "service" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("fastapi-offline") for d in service), "the assets' package is the service's dependency"


def test_docs_pages_follow_a_root_path(tmp_path, cache_copy):
    app = create_app(service_settings(tmp_path, {"demo": str(cache_copy)}))
    with TestClient(app, root_path="/jaxcache") as c:
        assert set(_urls(c.get("/docs").text)) >= {"/jaxcache/docs/assets/swagger-ui-bundle.js"}
        assert "/jaxcache/openapi.json" in c.get("/docs").text


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is missing: pip install --group dev")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium package where it can; set "
                    "JAXCACHE_CHROMIUM to use another")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.mark.slow
def test_swagger_ui_authorizes_and_tries_a_route_in_a_browser(browser, tmp_path, cache_copy):
    with jaxcache_serve({"demo": cache_copy}, f"sqlite:///{tmp_path / 'c.sqlite'}", tokens={READ: "read"}) as base:
        context = browser.new_context()
        context.set_default_timeout(20000)
        page = context.new_page()
        fetched: list[str] = []
        blocked: list[str] = []
        problems: list[str] = []
        page.on("requestfinished", lambda req: fetched.append(req.url))
        page.on("requestfailed", lambda req: blocked.append(req.url))
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.on("console", lambda msg: problems.append(msg.text)
                if msg.type == "error" and REDOC_LOGO not in msg.text else None)
        page.goto(f"{base}/docs")
        page.locator(".opblock").first.wait_for()
        assert page.locator(".opblock").count() >= 22
        page.get_by_role("button", name=re.compile("Authorize")).first.click()
        page.locator("#auth-bearer-value").fill(READ)  # the bearer scheme the document declares
        page.locator(".modal-ux button.authorize").click()
        page.locator(".modal-ux button.btn-done").click()
        op = page.locator("#operations-caches-listCaches")
        op.locator(".opblock-summary").click()
        op.get_by_role("button", name="Try it out").click()
        op.get_by_role("button", name="Execute").click()
        status = op.locator(".live-responses-table .response .response-col_status").first
        status.wait_for()
        assert status.inner_text().strip() == "200", op.locator(".live-responses-table").inner_text()
        assert '"demo"' in op.locator(".live-responses-table .microlight").first.inner_text()
        page.goto(f"{base}/redoc")
        page.locator('[data-section-id="tag/caches/operation/listCaches"]').first.wait_for(state="attached")
        assert page.locator("[data-section-id^='tag/']").count() >= 22
        context.close()
    assert fetched and all(u.startswith((base, "data:", "blob:")) for u in fetched), fetched
    assert set(blocked) <= {REDOC_LOGO}, blocked
    assert not problems, problems
    assert {f"{base}{docs.ASSETS_PATH}/swagger-ui-bundle.js", f"{base}{docs.ASSETS_PATH}/redoc.standalone.js",
            f"{base}/openapi.json"} <= set(fetched)


def test_api_still_wants_its_header_under_the_docs(client):
    # The docs page sends the token it is given as a bearer header; without one the API refuses as before.
    assert client.get("/v1/caches").status_code == 401
    assert client.get("/v1/caches", headers=H_READ).status_code == 200
