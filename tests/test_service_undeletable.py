"""Entries the service cannot delete (an immutable file, a directory named like one): DELETE and prunes say so
with the reason, keep the entry listed and audit a failure; the dashboard and `jaxcache prune --apply` say the
same."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dashboard_support import H_ADMIN as H_DASH_ADMIN
from jaxcache.cli.output import EXIT_PROBLEMS
from prune_support import run_cli
from reports_support import BOTH, H_ADMIN, H_READ, keys_of

ENTRIES = "/v1/caches/demo/entries"


@pytest.fixture
def immutable() -> Iterator[Callable[[Path], None]]:
    """``chattr +i`` on a path (CI runs as root); skips where that is not permitted. Cleared after the test, so the
    temporary directory can go."""
    made: list[Path] = []

    def make(path: Path) -> None:
        proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            reason = f"chattr +i is not permitted here ({proc.stderr.strip()}): immutable entries go untested"
            print(reason)
            pytest.skip(reason)
        made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def _audit(svc) -> dict:
    r = svc.get("/v1/caches/demo/prunes", headers=H_READ)
    assert r.status_code == 200, r.text
    return r.json()["prunes"][0]


@BOTH
def test_deleting_an_immutable_entry_is_a_409_that_says_why_and_keeps_it(svc, cache_copy, jax_caches, immutable):
    key = keys_of(jax_caches["zstd"])["jit_tiny"]
    immutable(cache_copy / f"{key}-cache")
    r = svc.delete(f"{ENTRIES}/{key}", headers=H_ADMIN)
    assert r.status_code == 409, r.text
    assert "immutable (chattr +i)" in r.json()["detail"] and "chattr -i" in r.json()["detail"], r.text
    # Storage holds it, so the catalog lists it: no row dropped for the next rescan to bring back.
    assert (cache_copy / f"{key}-cache").is_file() and (cache_copy / f"{key}-atime").is_file()
    assert svc.get(f"{ENTRIES}/{key}", headers=H_READ).status_code == 200
    audit = _audit(svc)
    assert (audit["kind"], audit["state"], audit["planned"], audit["deleted"]) == ("delete", "failed", 1, 0)
    assert any("immutable" in e for e in audit["errors"]), audit

    subprocess.run(["chattr", "-i", str(cache_copy / f"{key}-cache")], check=True)
    assert svc.delete(f"{ENTRIES}/{key}", headers=H_ADMIN).status_code == 204
    assert _audit(svc)["state"] == "done" and svc.get(f"{ENTRIES}/{key}", headers=H_READ).status_code == 404


@BOTH
def test_deleting_a_directory_named_like_an_entry_is_a_409_that_says_why(svc, cache_copy, jax_caches):
    # Listed as an entry, then replaced by a directory of the same name (no rescan since): the row stays.
    key = keys_of(jax_caches["zstd"])["jit_tiny"]
    path = cache_copy / f"{key}-cache"
    path.unlink()
    path.mkdir()
    (path / "inside").write_bytes(b"not JAX's")
    # And a directory that was never an entry: not one (rescans skip what is not a regular file), so 404.
    stray = "jit_stray-" + "5" * 64
    (cache_copy / f"{stray}-cache").mkdir()
    r = svc.delete(f"{ENTRIES}/{stray}", headers=H_ADMIN)
    assert r.status_code == 404, r.text
    assert (cache_copy / f"{stray}-cache").is_dir()
    for k in (key,):
        r = svc.delete(f"{ENTRIES}/{k}", headers=H_ADMIN)
        assert r.status_code == 409, (k, r.text)
        assert "is a directory, not a file JAX wrote" in r.json()["detail"], r.text
        assert (cache_copy / f"{k}-cache").is_dir()
        audit = _audit(svc)
        assert (audit["state"], audit["deleted"], audit["policy"]) == ("failed", 0, {"key": k}), audit
        assert any("is a directory" in e for e in audit["errors"]), audit
    assert (path / "inside").read_bytes() == b"not JAX's"
    assert svc.get(f"{ENTRIES}/{key}", headers=H_READ).status_code == 200


@BOTH
def test_a_prune_lists_what_it_could_not_delete_and_its_audit_says_failed(svc, cache_copy, jax_caches, immutable):
    keys = keys_of(jax_caches["zstd"])
    tiny, odd = keys["jit_tiny"], keys["jit_odd-name.v2"]
    immutable(cache_copy / f"{tiny}-cache")
    # The -atime of an entry the prune deletes is a directory: the entry goes, and the directory, not JAX's, is left
    # alone (the core never deletes what is not a regular file).
    (cache_copy / f"{odd}-atime").unlink()
    (cache_copy / f"{odd}-atime").mkdir()
    policy = {"functions": ["jit_tiny", "jit_odd*"], "min_age": "1h", "dry_run": False}
    r = svc.post("/v1/caches/demo/prune", json=policy, headers=H_ADMIN)
    assert r.status_code == 200, r.text
    applied = r.json()
    assert {d["key"] for d in applied["delete"]} == {tiny, odd}
    assert (applied["deleted"], applied["already_gone"], applied["changed"], applied["failed"]) == (1, 0, 0, 1)
    [stuck] = applied["errors"]
    assert tiny in stuck and "immutable (chattr +i)" in stuck, applied["errors"]
    assert (cache_copy / f"{tiny}-cache").is_file() and not (cache_copy / f"{odd}-cache").exists()
    assert (cache_copy / f"{odd}-atime").is_dir()
    assert svc.get(f"{ENTRIES}/{tiny}", headers=H_READ).status_code == 200
    assert svc.get(f"{ENTRIES}/{odd}", headers=H_READ).status_code == 404
    audit = _audit(svc)
    assert (audit["kind"], audit["state"], audit["planned"], audit["deleted"]) == ("prune", "failed", 2, 1), audit
    assert audit["errors"][0].startswith("1 of 2 planned objects could not be deleted"), audit
    assert stuck in audit["errors"]


def test_the_cli_prune_says_why_an_entry_was_not_deleted(capsys, cache_copy, jax_caches, immutable):
    keys = keys_of(jax_caches["zstd"])
    tiny = keys["jit_tiny"]
    immutable(cache_copy / f"{tiny}-cache")
    code, _, err = run_cli(capsys, "prune", str(cache_copy), "--function", "jit_tiny", "--min-age", "0s", "--apply")
    assert code == EXIT_PROBLEMS, err
    assert "immutable (chattr +i)" in err and "not even root may delete it" in err, err
    assert (cache_copy / f"{tiny}-cache").is_file()


def test_the_dashboard_says_an_applied_prune_failed_and_why(app_client, seeded, jax_caches, immutable):
    tiny = keys_of(jax_caches["zstd"])["jit_tiny"]
    immutable(seeded / f"{tiny}-cache")
    form = {"functions": "jit_tiny", "min_age": "0s", "confirm": "demo"}
    r = app_client.post("/caches/demo/prune", data=form, headers=H_DASH_ADMIN)
    assert r.status_code == 303, r.text
    page = app_client.get(r.headers["location"], headers=H_DASH_ADMIN).text
    assert 'data-state="failed"' in page and 'class="notice success"' not in page
    assert "immutable (chattr +i)" in page and (seeded / f"{tiny}-cache").is_file()
