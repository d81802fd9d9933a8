"""The web dashboard in a real browser: Playwright driving Debian's Chromium over `jaxcache serve` on a loopback
port. Screenshots of every page go to bench/out/screenshots/ (or $JAXCACHE_SCREENSHOTS); the path is printed at
the end of the run."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from conftest import serve_env, start_serve, stop_serve, wait_ready
from dashboard_support import (
    ADMIN,
    CHROMIUM,
    EVAL_MISS,
    H_READ,
    READ,
    TOKENS,
    TORN,
    _keys,
    listing,
    seed_cache,
)
from jaxcache.service.dashboard import format as dfmt
from screenshots_support import SCREENSHOTS

# --- in a real browser ------------------------------------------------------------------------------------------



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
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is missing: pip install --group dev")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium package where it can "
                    "(apt-get, as root or with sudo); set JAXCACHE_CHROMIUM to use another")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
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
    # The chart starts at the cache's first day (the seeded entries are 10 days old): no empty days before it.
    first = dfmt.datetime.fromtimestamp(api["first_created_s"], dfmt.UTC).date()
    days = (dfmt.datetime.now(dfmt.UTC).date() - first).days + 1
    assert page.locator("svg.growth rect.bar").count() == days
    assert page.locator("svg.growth rect.bar title").first.text_content().startswith(first.isoformat() + ":")
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


@pytest.mark.slow
def test_browser_prune_form_placeholders_are_not_cut_off(served, page):
    """#52: every placeholder of the prune form fits its field (the integrity classes' did not)."""
    login(page, served.base, READ, "/caches/demo/prune")
    cut = page.evaluate("""() => {
        const ctx = document.createElement("canvas").getContext("2d");
        return [...document.querySelectorAll("form.policy input[placeholder]")].flatMap(i => {
            const s = getComputedStyle(i);
            ctx.font = `${s.fontStyle} ${s.fontWeight} ${s.fontSize} ${s.fontFamily}`;
            const room = i.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
            const need = ctx.measureText(i.placeholder).width;
            return need > room ? [[i.id, Math.round(need), Math.round(room)]] : [];
        });
    }""")
    assert page.locator("#p-integrity").is_visible()
    assert cut == [], cut  # (field, pixels the placeholder needs, pixels the field has)
