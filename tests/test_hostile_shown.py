"""What a rescan skipped is shown (#32): the count and the first names, escaped, in GET /v1/caches and on the
dashboard's cache page, from the catalog (so every replica shows the same), on SQLite and PostgreSQL catalogs;
the next rescan of a root with the jams gone shows none."""

from __future__ import annotations

import os
import re
import shutil

import markupsafe
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache.display import shown
from jaxcache.service.app import create_app
from jaxcache.service.catalog.models import SKIPPED_SHOWN
from reports_support import H_READ, rescan, settings
from test_hostile_root import BIDI_MODULE, key_of


def _status(client) -> dict:
    r = client.get("/v1/caches", headers=H_READ)
    assert r.status_code == 200, r.text
    assert "\u202e" not in r.text  # an override in a name never reaches a client unescaped
    (info,) = r.json()["caches"]
    return info


def _listed(client) -> list[str]:
    r = client.get("/v1/caches/demo/entries?limit=1000", headers=H_READ)
    assert r.status_code == 200, r.text
    return sorted(e["key"] for e in r.json()["entries"])


def _page(client) -> str:
    r = client.get("/caches/demo", headers=H_READ)
    assert r.status_code == 200, r.text
    assert "\u202e" not in r.text
    return r.text


def test_a_rescan_shows_what_it_skipped(tmp_path, jax_caches, catalog_url):
    root = tmp_path / "cache"
    shutil.copytree(jax_caches["zstd"].root, root)
    keys = sorted(e["key"] for e in jax_caches["zstd"].entries)
    data = (root / f"{keys[0]}-cache").read_bytes()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "entry-cache").write_bytes(data)
    jams = {
        key_of("jit_fifo", "1") + "-cache": "a FIFO",
        key_of("jit_link", "2") + "-cache": "a symbolic link",  # out of the root
        key_of("jit_a\\b\u202e", "3") + "-cache": "not a relative path",  # a real file no backend may map
        key_of(BIDI_MODULE, "4") + "-atime": "a FIFO",
    }
    many = [key_of("jit_many", str(i)) + "-cache" for i in range(SKIPPED_SHOWN + 2)]

    with TestClient(create_app(settings(tmp_path, {"demo": str(root)}, db=catalog_url))) as client:
        settled(client)
        info = _status(client)
        assert (info["last_scan_skipped"], info["last_scan_skipped_names"]) == (0, [])
        assert 'data-stat="last_scan_skipped"' not in _page(client)

        os.mkfifo(root / (key_of("jit_fifo", "1") + "-cache"))
        (root / (key_of("jit_link", "2") + "-cache")).symlink_to(outside / "entry-cache")
        (root / (key_of("jit_a\\b\u202e", "3") + "-cache")).write_bytes(data)
        os.mkfifo(root / (key_of(BIDI_MODULE, "4") + "-atime"))
        assert rescan(client)["skipped"] == len(jams)
        info = _status(client)
        assert info["last_scan_error"] is None and info["last_scan_skipped"] == len(jams), info
        reasons = {s["name"]: s["why"] for s in info["last_scan_skipped_names"]}
        assert list(reasons) == [shown(name) for name in sorted(jams)]  # by name, escaped
        for name, what in jams.items():
            assert what in reasons[shown(name)], (name, reasons)
        assert "jit_a\\\\b\\u202e-" in "".join(reasons)  # the backslash doubled, the override written out
        assert _listed(client) == keys  # every real entry, nothing of the jams
        page = _page(client)
        assert f'data-stat="last_scan_skipped" data-value="{len(jams)}"' in page
        for name in jams:
            assert str(markupsafe.escape(shown(name))) in page, name
        index = client.get("/", headers=H_READ).text
        assert f'data-skipped="{len(jams)}"' in index  # the caches' table points at the page that lists them

        # Many: the count is whole, the names the first few.
        for name in many:
            os.mkfifo(root / name)
        rescan(client)
        info = _status(client)
        assert info["last_scan_skipped"] == len(jams) + len(many)
        first = [shown(name) for name in sorted([*jams, *many])[:SKIPPED_SHOWN]]
        assert [s["name"] for s in info["last_scan_skipped_names"]] == first
        assert re.search(rf"The first\s+{SKIPPED_SHOWN} by name", _page(client))

        for name in [*jams, *many]:
            (root / name).unlink()
        assert rescan(client)["skipped"] == 0
        info = _status(client)
        assert (info["last_scan_skipped"], info["last_scan_skipped_names"]) == (0, [])
        assert 'data-stat="last_scan_skipped"' not in _page(client)
        assert "data-skipped" not in client.get("/", headers=H_READ).text
        assert _listed(client) == keys
