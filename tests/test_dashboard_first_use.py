"""What a first look at the dashboard finds (#52): a young cache's figures as what they are, how to apply a prune
from the demo, and counts said with their nouns."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from fastapi.testclient import TestClient

from dashboard_support import DAY, H_ADMIN, H_READ, settings, shown_text
from jaxcache.service.app import create_app
from jaxcache.service.dashboard import format as dfmt


def _overview_of(tmp_path, root):
    with TestClient(create_app(settings(tmp_path, root)), follow_redirects=False) as client:
        assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
        assert client.post("/v1/caches/demo/verify", json={"recheck_all": True}, headers=H_ADMIN).status_code == 200
        return (client.get("/v1/caches/demo/stats", headers=H_READ).json(),
                client.get("/v1/caches/demo/integrity", headers=H_READ).json(),
                client.get("/caches/demo", headers=H_READ).text)


def test_a_young_cache_page_says_what_its_figures_are(tmp_path, jax_caches):
    """#52: a cache minutes old has no mean growth per day ("n/a", null in the API), its chart starts at its first
    day, not 30 days of zeros before it, and the integrity line counts in the tiles' own words."""
    root = tmp_path / "young"
    shutil.copytree(jax_caches["zstd"].root, root)
    now = time.time()
    for p in root.iterdir():
        os.utime(p, (now - 60, now - 60))
    api, integrity, page = _overview_of(tmp_path, root)
    assert api["bytes_per_day"] is None and api["first_created_s"] == pytest.approx(now - 60, abs=2)
    assert 'data-stat="bytes_per_day" data-value=""' in page
    assert re.search(r'data-stat="bytes_per_day" data-value=""[^>]*>\s*n/a\s*<', page)
    today = dfmt.datetime.fromtimestamp(now, dfmt.UTC).date().isoformat()
    days = re.findall(r"<rect [^>]*class=\"bar\"><title>(\d{4}-\d\d-\d\d):", page)
    assert days == [today], days  # one day of history: one bar, not 29 empty days before it
    ticks = re.findall(r'<text [^>]*class="tick"[^>]*>([^<]*)</text>', page)
    assert ticks[-2:] == [f"{today} 00:00", "24:00 UTC"], ticks  # its ends' times, not its date twice (#73)
    assert f"bytes held, on {today} (UTC)</title>" in page
    summary = re.search(r"<p class=\"meta\" data-integrity-summary>(.*?)</p>", page, re.S).group(1)
    assert " verified" not in summary and " attested" not in summary, summary  # the tiles' words only
    counts = integrity["counts"]
    assert re.search(rf"{counts['ok']}\s+ok\b", summary) and re.search(rf"{counts['unattested']}\s+unattested", summary)
    assert f"{integrity['verified']} of {integrity['entries']} entries checked" in summary
    for cls in ("ok", "unattested"):
        assert f'data-stat="integrity-{cls}" data-value="{counts[cls]}"' in page


def test_a_three_day_old_cache_grows_by_its_mean_over_three_days(tmp_path, jax_caches):
    root = tmp_path / "three-days"
    shutil.copytree(jax_caches["zstd"].root, root)
    then = time.time() - 3 * DAY
    for p in root.iterdir():
        os.utime(p, (then, then))
    api, _, page = _overview_of(tmp_path, root)
    assert api["bytes_per_day"] == pytest.approx(api["size_bytes"] / 3, rel=1e-3)  # not a seventh of it per day
    assert "Growth (mean of 3.0 d)" in page
    first = dfmt.datetime.fromtimestamp(then, dfmt.UTC).date()
    days = re.findall(r"<rect [^>]*class=\"bar\"><title>(\d{4}-\d\d-\d\d):", page)
    assert days[0] == first.isoformat() and len(days) == 4, days
    ticks = re.findall(r'<text [^>]*class="tick"[^>]*>([^<]*)</text>', page)
    assert ticks[-2:] == [days[0], days[-1]], ticks  # several days: the first's and the last's dates


def test_the_growth_chart_starts_at_the_first_day():
    today = dfmt.datetime(2026, 11, 30).date()
    chart = dfmt.growth_chart([{"day": "2026-11-28", "entries": 1, "size_bytes": 100}], 100, today=today,
                              first_day=dfmt.date(2026, 11, 28))
    assert [b.day for b in chart.bars] == ["2026-11-28", "2026-11-29", "2026-11-30"]
    assert all(b.width <= 48 for b in chart.bars)
    assert len(dfmt.growth_chart([], 0, today=today, first_day=dfmt.date(2025, 1, 1)).bars) == 30
    assert [b.day for b in dfmt.growth_chart([], 0, today=today, first_day=today).bars] == ["2026-11-30"]
    # The line of bytes held is drawn on a one-day cache too (#60): a level line across the day, not one point.
    one = dfmt.growth_chart([{"day": "2026-11-30", "entries": 2, "size_bytes": 100}], 100, today=today,
                            first_day=today)
    points = [tuple(map(float, p.split(","))) for p in one.line.split()]
    assert len({x for x, _ in points}) >= 2 and {y for _, y in points} == {one.bars[0].y}, one.line
    assert points[0][0] == one.left and points[-1][0] == one.right
    assert dfmt.growth_label(None) == "0.0 d" and dfmt.growth_label(0.0, now=8 * DAY) == "7 d"


def test_the_demo_says_how_to_apply_a_prune(tmp_path, seeded):
    """#52: without tokens the prune page names the setting that enables applying; `make run`'s demo token, served
    with that setting, signs in as admin and gets the apply form."""
    with TestClient(create_app(settings(tmp_path, seeded, tokens={})), follow_redirects=False) as client:
        page = client.get("/caches/demo/prune?corrupt=on&preview=1").text
        denied = re.search(r"<p class=\"notice\" data-apply-denied>(.*?)</p>", page, re.S).group(1)
        assert "<code data-setting>JAXCACHE_TOKENS_FILE</code>" in denied and "--tokens-file" in denied
        assert "JAXCACHE_TOKENS_FILE=demo-catalog/tokens make run" in denied
        assert "you are not signed in with one. This service has no tokens" in " ".join(shown_text(denied).split())
    demo = tmp_path / "demo-catalog"
    made = subprocess.run([sys.executable, "-m", "jaxcache.service.demo", str(demo)], capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert f"JAXCACHE_TOKENS_FILE={demo / 'tokens'} make run" in made.stderr
    assert str(demo / "admin-token") in made.stderr
    token = (demo / "admin-token").read_text().strip()
    assert (demo / "admin-token").stat().st_mode & 0o077 == 0  # the token is the owner's only
    again = subprocess.run([sys.executable, "-m", "jaxcache.service.demo", str(demo)], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0 and (demo / "admin-token").read_text().strip() == token  # kept across runs
    with TestClient(create_app(settings(tmp_path, seeded, tokens={}, tokens_file=demo / "tokens")),
                    follow_redirects=False) as client:
        assert client.post("/login", data={"token": token, "next": "/caches/demo/prune"}).status_code == 303
        page = client.get("/caches/demo/prune?corrupt=on&preview=1").text
        assert 'class="apply"' in page and "data-apply-denied" not in page


def test_counts_on_pages_say_their_nouns_in_the_number_they_count():
    assert dfmt.counted(1, "entry") == "1 entry"
    assert dfmt.counted(12345, "entry") == "12,345 entries"
    assert dfmt.counted(0, "object") == "0 objects"


def test_the_prune_form_says_its_errors_in_its_own_words(tmp_path, seeded):
    """#60: a bad field is named by its label, in the words the entries filter uses, never pydantic's ("Value
    error, ...") or the API's field names; a read token's notice reads as sentences."""
    with TestClient(create_app(settings(tmp_path, seeded)), follow_redirects=False) as client:
        def error(query: str) -> str:
            r = client.get(f"/caches/demo/prune?{query}&preview=1", headers=H_READ)
            assert r.status_code == 400, r.text
            return " ".join(shown_text(re.search(r'<p class="error" role="alert" data-error>(.*?)</p>', r.text,
                                                 re.S).group(1)).split())

        said = error("max_total_bytes=lots")
        assert said == "Max total size: 'lots' is not a size: use a number with an optional unit, like 500MiB or 50GB"
        assert error("unused_for=soon&older_than=-3d") == (
            "Unused for: 'soon' is not a duration: use a number with s, m, h, d or w, like 14d; Older than: '-3d' "
            "is not a duration: use a number with s, m, h, d or w, like 14d")
        said = error("integrity=bogus")
        assert said.startswith("Integrity classes: 'bogus' should be 'tampered', 'mismatched'"), said
        said = error("min_age=0s")
        assert said == ("the policy selects nothing: set “Max total size”, “Unused for”, “Older than”, “Functions”, "
                        "“Corrupt entries”, “Orphaned -atime files”, “Stale jaxlib” or “Integrity classes”"), said
        page = client.get("/caches/demo/prune?corrupt=on&preview=1", headers=H_READ).text
        denied = re.search(r"<p class=\"notice\" data-apply-denied>(.*?)</p>", page, re.S).group(1)
        assert "signed in with a read token. Sign in with an admin token" in " ".join(shown_text(denied).split())
