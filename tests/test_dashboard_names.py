"""Names that deceive (#49): job and function names with bidirectional overrides, zero-width characters and letters
of another script, reported by real run records and a warm-up's coverage record over real entries. Every page that
shows them (jobs, a job, an entry, entries, warm-ups, a warm-up) shows format characters escaped, and marks a name
that mixes scripts; the API keeps the exact value."""

from __future__ import annotations

import re
import shutil
import time
import urllib.parse

import pytest
from fastapi.testclient import TestClient

from dashboard_support import H_ADMIN, H_READ, _keys, _record, settings, shown_text
from jaxcache import coverage, records
from jaxcache.records import KeyUsage
from jaxcache.service.app import create_app
from jaxcache.service.dashboard import names

BIDI = "eval\u202enur\u202c"  # displays as "evalrun" reversed: "evalrun" read as another job's name
ZERO_WIDTH = "llm-pre\u200btrain"  # displays exactly as "llm-pretrain"
HOMOGLYPH = "tr\u0430in"  # a Cyrillic "а": displays exactly as "train"
MIXED_FUNCTION = "jit_tr\u0430in_step"
FORMAT_CHARS = ("\u202e", "\u202c", "\u200b")


def badged(page: str, name: str) -> bool:
    """``name`` (escaped as pages show it) followed, within its element, by the mixed-scripts badge."""
    return re.search(re.escape(str(names.visible(name))) + r"(</code>)?\s*<span class=\"badge mixed-scripts\" "
                     r"data-mixed-scripts title=\"This name mixes scripts \(Cyrillic, Latin\)", page) is not None


@pytest.fixture
def hostile(tmp_path, seeded, jax_caches):
    """The seeded cache plus a real entry under a mixed-script function name, written by the bidi job and hit by
    the other two, which also each miss a mixed-script program; and a warm-up of the homoglyph job."""
    keys = _keys(jax_caches["zstd"].manifest)
    tiny = keys["jit_tiny"]
    mixed_key = f"{MIXED_FUNCTION}-{tiny.rsplit('-', 1)[1]}"
    for suffix in ("-cache", "-atime"):
        shutil.copy2(seeded / f"{tiny}{suffix}", seeded / f"{mixed_key}{suffix}")
    missed = f"{MIXED_FUNCTION}-{'e' * 64}"
    now = time.time()
    runs = [_record(BIDI, "bidi-1", [KeyUsage(key=mixed_key, event=records.WRITE, compiles=1, writes=1, compile_s=1.5,
                                              first_at=now - 600, last_at=now - 600)], at=now - 600)]
    for i, job in enumerate((ZERO_WIDTH, HOMOGLYPH)):
        runs.append(_record(job, f"run-{i}", [
            KeyUsage(key=mixed_key, event=records.HIT, hits=1, first_at=now - 60, last_at=now - 60),
            KeyUsage(key=missed, event=records.COMPILED, compiles=1, compile_s=2.0, reason="below the threshold",
                     first_at=now - 50, last_at=now - 50)], at=now - 50))
    for r in runs:
        (seeded / r.name).parent.mkdir(parents=True, exist_ok=True)
        (seeded / r.name).write_bytes(r.to_json())
    warm = coverage.WarmupRecord(
        id="w-homoglyph", job=HOMOGLYPH, topology="1x1x1", platform="cpu", started_at=now - 900,
        finished_at=now - 800, cache_dir=str(seeded), fingerprint=records.Fingerprint(jax="0.10.2", jaxlib="0.10.2"),
        programs=(coverage.ProgramCoverage(mixed_key, MIXED_FUNCTION, coverage.PRESENT),))
    (seeded / warm.name).parent.mkdir(parents=True, exist_ok=True)
    (seeded / warm.name).write_bytes(warm.to_json())
    with TestClient(create_app(settings(tmp_path, seeded)), follow_redirects=False) as client:
        assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
        yield client, mixed_key


def page(client, url: str) -> str:
    r = client.get(url, headers=H_READ)
    assert r.status_code == 200, (url, r.text[:500])
    return r.text


def job_url(job: str) -> str:
    return "/caches/demo/jobs/" + urllib.parse.quote(job, safe="")


def test_every_page_shows_format_characters_escaped(hostile):
    client, key = hostile
    urls = ["/caches/demo/jobs", *(job_url(j) for j in (BIDI, ZERO_WIDTH, HOMOGLYPH)),
            f"/caches/demo/entries/{urllib.parse.quote(key)}", "/caches/demo/entries?limit=200",
            "/caches/demo/warmups", "/caches/demo/warmups/w-homoglyph"]
    seen = {}
    for url in urls:
        text = shown_text(page(client, url))
        for ch in FORMAT_CHARS:
            assert ch not in text, (url, ch)
        seen[url] = text
    assert all(str(names.visible(j)) in seen["/caches/demo/jobs"] for j in (BIDI, ZERO_WIDTH, HOMOGLYPH))
    assert "eval\\u202enur\\u202c" in seen[job_url(BIDI)] and "llm-pre\\u200btrain" in seen[job_url(ZERO_WIDTH)]
    entry = seen[f"/caches/demo/entries/{urllib.parse.quote(key)}"]
    assert "eval\\u202enur\\u202c" in entry and "llm-pre\\u200btrain" in entry  # first writer and users
    assert "eval\\u202enur\\u202c" in seen["/caches/demo/entries?limit=200"]  # the first writer column
    # The API's JSON keeps the exact names: a client compares them, it does not read them.
    jobs = client.get("/v1/caches/demo/jobs", headers=H_READ).json()["jobs"]
    assert {BIDI, ZERO_WIDTH, HOMOGLYPH} <= {j["job"] for j in jobs}


def test_a_name_that_mixes_scripts_is_marked_wherever_it_is_shown(hostile):
    client, key = hostile
    assert names.mixes_scripts(HOMOGLYPH) and names.mixes_scripts(MIXED_FUNCTION)
    for plain in ("train", "jit_train_step", "jit_odd-name.v2", "日本語のかな", "한국어漢字", "Ελληνικά", "a\u0301b",
                  BIDI):
        assert not names.mixes_scripts(plain), plain
    assert names.scripts_of(HOMOGLYPH) == ["Cyrillic", "Latin"]
    assert badged(page(client, "/caches/demo/jobs"), HOMOGLYPH)
    homoglyph_page = page(client, job_url(HOMOGLYPH))
    assert badged(homoglyph_page, HOMOGLYPH) and badged(homoglyph_page, MIXED_FUNCTION)  # the job, its misses
    assert "<title>Job tr\u0430in (mixed scripts)" in homoglyph_page
    entry = page(client, f"/caches/demo/entries/{urllib.parse.quote(key)}")
    assert badged(entry, MIXED_FUNCTION) and badged(entry, HOMOGLYPH)  # the function, a job that used it
    assert badged(page(client, "/caches/demo/entries?limit=200"), MIXED_FUNCTION)
    assert badged(page(client, "/caches/demo/warmups"), HOMOGLYPH)
    warm = page(client, "/caches/demo/warmups/w-homoglyph")
    assert badged(warm, HOMOGLYPH) and badged(warm, MIXED_FUNCTION)
    # Names of one script carry no badge: the seeded jobs' pages have none.
    assert "data-mixed-scripts" not in page(client, "/caches/demo/jobs/llm-eval")


def test_form_values_go_back_as_they_came(hostile):
    """A filter the page echoes back is the exact value (escaping it would change what the next submit asks)."""
    client, _ = hostile
    text = page(client, "/caches/demo/entries?job=" + urllib.parse.quote(ZERO_WIDTH))
    assert f'value="{ZERO_WIDTH}"' in text
