"""Hostile input to the dashboard (#58, kept from the red team's round two): markup in every name a bucket writer or
a report token holder controls, and in what a link can put in a query, shown as text on every page; `next` values
that would lead off the site after signing in; forged prune forms; and sign-ins that must not work. Through the
ASGI app, over a copy of the session's real entries."""

from __future__ import annotations

import html
import html.parser
import re
import shutil
import time
import urllib.parse

import pytest
from fastapi.testclient import TestClient

from conftest import settled
from dashboard_support import (
    ADMIN,
    H_ADMIN,
    H_READ,
    READ,
    REPORT,
    _keys,
    _record,
    listing,
    seed_cache,
    settings,
    sha,
    shown_text,
)
from jaxcache import coverage, records
from jaxcache.records import KeyUsage
from jaxcache.service.app import create_app
from jaxcache.service.dashboard import site

# Markup where a name goes. A job name may hold no "/" (so no closing tag), a key none either.
JOB = '"><img src=x onerror=alert(1)>'
FUNCTION = "jit_<svg onload=alert(2)>"
SCRIPT = "<script>alert(3)</script>"
ATTRIBUTE = "\" autofocus onfocus=alert(4) x=\""
WARMUP_ID = "w-hostile"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, jax_caches):
    """The dashboard's seeded cache plus a real entry under a key with markup in its function, run records whose
    job, host, topology, function and reason hold markup, and a warm-up record whose job and GPU model do."""
    tmp = tmp_path_factory.mktemp("dashboard-injection")
    root = tmp / "cache"
    shutil.copytree(jax_caches["zstd"].root, root)
    now = time.time()
    seed_cache(root, jax_caches["zstd"].manifest, now=now)
    tiny = _keys(jax_caches["zstd"].manifest)["jit_tiny"]
    key = f"{FUNCTION}-{tiny.rsplit('-', 1)[1]}"
    for suffix in ("-cache", "-atime"):
        shutil.copy2(root / f"{tiny}{suffix}", root / f"{key}{suffix}")
    missed = f"jit_missed-{'e' * 64}"
    run = records.RunRecord(
        job=JOB, run_id="xss-1", process_index=0, process_count=1, host=SCRIPT, started_at=now - 700,
        updated_at=now - 600, topology=ATTRIBUTE, final=True,
        fingerprint=records.Fingerprint(jax=SCRIPT, jaxlib="0.10.2", backend=ATTRIBUTE, device_kind=SCRIPT),
        keys=[KeyUsage(key=key, event=records.WRITE, compiles=1, writes=1, compile_s=1.5, first_at=now - 650,
                       last_at=now - 650),
              KeyUsage(key=missed, event=records.COMPILED, function=SCRIPT, compiles=1, compile_s=2.0, reason=SCRIPT,
                       first_at=now - 640, last_at=now - 640)])
    other = _record("llm-reader", "xss-2", [KeyUsage(key=key, event=records.HIT, hits=2, first_at=now - 60,
                                                     last_at=now - 60)], at=now - 60)
    warm = coverage.WarmupRecord(
        id=WARMUP_ID, job=JOB, topology="1x1x1", platform="gpu", gpu_model=SCRIPT, started_at=now - 900,
        finished_at=now - 800, cache_dir=str(root), fingerprint=records.Fingerprint(jax="0.10.2", jaxlib="0.10.2"),
        programs=(coverage.ProgramCoverage(key, FUNCTION, coverage.WRITTEN, 1.5, 1000, reason=SCRIPT),
                  coverage.ProgramCoverage(missed, SCRIPT, coverage.PRESENT)))
    for name, data in ((run.name, run.to_json()), (other.name, other.to_json()), (warm.name, warm.to_json())):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    with TestClient(create_app(settings(tmp, root)), follow_redirects=False) as client:
        settled(client)
        assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
        jobs = {j["job"] for j in client.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"]}
        warmups = {w["id"] for w in client.get("/v1/caches/demo/warmups", headers=H_READ).json()["warmups"]}
        assert JOB in jobs and WARMUP_ID in warmups, (jobs, warmups)
        yield client, key, root


@pytest.fixture
def browser(hostile):
    """The module's app as a browser that has not signed in: the client, and the cache's root."""
    client, _, root = hostile
    client.cookies.clear()
    yield client, root
    client.cookies.clear()


def q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


PAGES = {  # page -> (URL, what of the markup it shows as text)
    "caches": (lambda key: "/", None),
    "overview": (lambda key: "/caches/demo", None),
    "entries": (lambda key: "/caches/demo/entries?limit=200", FUNCTION),
    "entries, filters echoed": (lambda key: f"/caches/demo/entries?job={q(JOB)}&topology={q(ATTRIBUTE)}", None),
    "entry": (lambda key: f"/caches/demo/entries/{q(key)}", JOB),
    "jobs": (lambda key: "/caches/demo/jobs", JOB),
    "job": (lambda key: f"/caches/demo/jobs/{q(JOB)}", SCRIPT),
    "warm-ups": (lambda key: "/caches/demo/warmups", SCRIPT),
    "warm-up": (lambda key: f"/caches/demo/warmups/{WARMUP_ID}", SCRIPT),
    "prune preview": (lambda key: f"/caches/demo/prune?functions={q(FUNCTION)}&keep={q(SCRIPT)}&min_age=0s&preview=1",
                      FUNCTION),
    "an error page": (lambda key: f"/caches/demo/entries?cursor={q(SCRIPT)}", None),
    "sign-in": (lambda key: f"/login?next={q('/' + SCRIPT)}", None),
}


class _Active(html.parser.HTMLParser):
    """Everything in a page that a browser would run or follow: scripts, event handlers, script URLs, frames."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" and not (a.get("src") or "").startswith("/static/"):
            self.found.append(f"an inline <script> {attrs}")
        if tag in ("iframe", "object", "embed", "base", "meta") and tag != "meta" or (
                tag == "meta" and "refresh" in (a.get("http-equiv") or "").lower()):
            self.found.append(f"<{tag} {attrs}>")
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"<{tag}> with {name}={value!r}")
            if name in ("href", "src", "action", "formaction") and re.sub(r"[\s\x00-\x1f]", "", value or "").lower(
                    ).startswith(("javascript:", "data:", "vbscript:")):
                self.found.append(f"<{tag}> with {name}={value!r}")

    handle_startendtag = handle_starttag


@pytest.mark.parametrize("page", list(PAGES))
def test_markup_in_names_and_queries_is_shown_as_text_on_every_page(hostile, page):
    client, key, _ = hostile
    url, shown = PAGES[page]
    r = client.get(url(key), headers=H_READ)
    assert r.status_code in (200, 400), (page, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("text/html") and "script-src 'self'" in r.headers[
        "content-security-policy"]
    active = _Active()
    active.feed(r.text)
    assert active.found == [], (page, active.found)
    if shown is not None:  # the markup reached the page, as text a reader sees
        assert shown in shown_text(r.text), (page, shown)


# --- where a sign-in leads ---------------------------------------------------------------------------------------


def stays_on_this_site(url: str) -> bool:
    """True when a browser following ``url`` from this site stays on it: WHATWG URL parsing drops tabs and
    newlines and reads a backslash as a slash, so what is left must be a path, not ``//host`` or ``scheme:``."""
    read = re.sub(r"[\t\n\r]", "", url).replace("\\", "/")
    return read.startswith("/") and not read.startswith("//")


EVIL_NEXT = ["//evil.example/x", "https://evil.example/", "/\\evil.example", "\\\\evil.example", "/\t/evil.example",
             "/\\\t/evil.example", " //evil.example", "///evil.example", "javascript:alert(1)", "http:evil.example",
             "/%2F%2Fevil.example", "/\r\nSet-Cookie: x=1", "\t//evil.example", "//evil.example@demo"]


@pytest.mark.parametrize("evil", EVIL_NEXT, ids=[repr(e) for e in EVIL_NEXT])
def test_a_sign_in_never_leads_off_the_site(browser, evil):
    app_client, _ = browser
    form = app_client.get(f"/login?next={q(evil)}").text  # the sign-in form carries it to its post
    (carried,) = re.findall(r'<input type="hidden" name="next" value="([^"]*)"', form)
    for sent in (evil, html.unescape(carried)):
        r = app_client.post("/login", data={"token": READ, "next": sent})
        assert r.status_code == 303 and stays_on_this_site(r.headers["location"]), (sent, r.headers["location"])
        assert "\n" not in r.headers["location"] and "set-cookie: x" not in str(r.headers).lower()


def test_a_page_asked_for_without_a_token_comes_back_to_itself(browser):
    app_client, _ = browser
    for path in ("/caches/demo/jobs", "//evil.example/caches", "/caches/demo/entries?x=%2F%2Fevil.example"):
        r = app_client.get(path)
        if r.status_code == 303:
            target = urllib.parse.parse_qs(urllib.parse.urlsplit(r.headers["location"]).query)["next"][0]
            assert stays_on_this_site(target) and app_client.post("/login", data={
                "token": READ, "next": target}).headers["location"] == target, (path, target)
        app_client.cookies.clear()


# --- forged prune forms ------------------------------------------------------------------------------------------

FORM = {"corrupt": "on", "min_age": "0s", "confirm": "demo"}


def _form_tokens(client) -> dict[str, str]:
    """The form tokens the signed-in viewer's prune page carries: the logout form's, and the prune form's (an
    admin's page only)."""
    page = client.get("/caches/demo/prune?corrupt=on&min_age=0s&preview=1").text
    found = {"logout": re.search(r'action="/logout".*?name="csrf" value="([0-9a-f]{64})"', page, re.S).group(1)}
    if 'class="apply"' in page:
        apply_form = page[page.index('class="apply"'):]
        found["prune"] = re.search(r'name="csrf" value="([0-9a-f]{64})"', apply_form).group(1)
    return found


FORGERIES = {  # what a page on another site (or a link) can send, with the admin's cookie
    "no form token": lambda t: ({"data": FORM}, 403),
    "an empty form token": lambda t: ({"data": {**FORM, "csrf": ""}}, 403),
    "the logout form's token": lambda t: ({"data": {**FORM, "csrf": t["logout"]}}, 403),
    "the token in upper case": lambda t: ({"data": {**FORM, "csrf": t["prune"].upper()}}, 403),
    "the token cut short": lambda t: ({"data": {**FORM, "csrf": t["prune"][:32]}}, 403),
    "the token in the query string": lambda t: ({"data": FORM, "params": {"csrf": t["prune"]}}, 403),
    "marked cross-site by the browser": lambda t: ({"data": {**FORM, "csrf": t["prune"]},
                                                    "headers": {"Sec-Fetch-Site": "cross-site"}}, 403),
    "a text/plain form": lambda t: ({"content": urllib.parse.urlencode({**FORM, "csrf": t["prune"]}),
                                     "headers": {"content-type": "text/plain"}}, 415),
    "a JSON body": lambda t: ({"json": {**FORM, "csrf": t["prune"]}}, 415),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forged_prune_form_deletes_nothing(browser, forgery):
    app_client, seeded = browser
    app_client.post("/login", data={"token": ADMIN})
    sent, status = FORGERIES[forgery](_form_tokens(app_client))
    before = listing(seeded)
    r = app_client.post("/caches/demo/prune", **sent)
    assert r.status_code == status, (forgery, r.status_code, r.text[:300])
    assert listing(seeded) == before
    assert app_client.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"] == []


def test_a_link_with_the_form_fields_only_previews(browser):
    """GET never applies: a link (or an image) that carries every field of the form, the token included."""
    app_client, seeded = browser
    app_client.post("/login", data={"token": ADMIN})
    token = _form_tokens(app_client)["prune"]
    before = listing(seeded)
    r = app_client.get("/caches/demo/prune", params={**FORM, "csrf": token, "apply": "1", "dry_run": "false"})
    assert r.status_code == 200 and listing(seeded) == before
    assert app_client.get("/v1/caches/demo/prunes", headers=H_READ).json()["prunes"] == []


def test_a_forged_logout_keeps_the_viewer_signed_in(browser):
    app_client, _ = browser
    app_client.post("/login", data={"token": READ})
    for forged in ({"csrf": ""}, {"csrf": "0" * 64}):
        assert app_client.post("/logout", data=forged).status_code == 403
        assert app_client.get("/caches/demo").status_code == 200
    assert app_client.post("/logout", data={"csrf": _form_tokens(app_client)["logout"]}).status_code == 303


# --- sign-ins that must not work ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("token", "status"), [
    (sha(READ), 401),  # the hash the service is configured with is not the token
    (READ.upper(), 401),
    (READ + "x", 401),
    (REPORT, 403),  # a report token reads nothing
    ("x" * 70_000, 413),  # over the body limit
], ids=["the configured hash", "upper case", "one character more", "a report token", "70 KB"])
def test_a_sign_in_with_a_wrong_token_sets_no_cookie(browser, token, status):
    app_client, _ = browser
    r = app_client.post("/login", data={"token": token, "next": "/caches/demo"})
    assert r.status_code == status and site.COOKIE not in r.headers.get("set-cookie", ""), r.text[:200]
    assert app_client.get("/caches/demo").status_code == 303  # still sent to sign in


def test_a_token_in_a_link_signs_nobody_in(browser):
    app_client, _ = browser
    r = app_client.get("/login", params={"token": READ, "next": "/caches/demo"})
    assert r.status_code == 200 and site.COOKIE not in r.headers.get("set-cookie", "")
    assert app_client.get(f"/caches/demo?token={READ}").status_code == 303
