"""The scanner over real JAX caches: on a directory, on GCS, and on a gs:// cache JAX itself wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_writer
from jaxcache import entry as fmt
from jaxcache.entry import Status
from jaxcache.scan import Entry, Orphan, scan
from jaxcache.storage import open_storage
from store_servers import put_dir, raw_put


def _by_key(records):
    return {r.key: r for r in records if isinstance(r, Entry)}


def _assert_matches(entries: dict[str, Entry], manifest: dict) -> None:
    assert set(entries) == {e["key"] for e in manifest["entries"]}
    for e in manifest["entries"]:
        got = entries[e["key"]]
        assert got.module == e["module"]
        assert got.size_bytes == e["size_bytes"]
        assert got.compile_seconds == e["stored_compile_seconds"]
        assert got.compression.value == e["compression"]
        assert got.status is Status.OK
        assert (got.atime_ns is not None) == e["has_atime"]


def _add_noise(root: Path, key: str) -> None:
    """What else sits in real cache roots: our records, XLA sub-caches, stray files, and an orphan."""
    (root / ".jaxcache" / "runs").mkdir(parents=True)
    (root / ".jaxcache" / "runs" / "r-p0.json").write_text("{}")
    (root / "xla_gpu_per_fusion_autotune_cache_dir").mkdir()
    (root / "xla_gpu_per_fusion_autotune_cache_dir" / "x").write_text("x")
    (root / "README.txt").write_text("not JAX's")
    (root / f"{key}-atime").write_bytes(fmt.encode_atime(1))


ORPHAN_KEY = "jit_gone-" + "0" * 64


def test_scan_local_real_cache(cache_copy, jax_caches):
    _add_noise(cache_copy, ORPHAN_KEY)
    records = list(scan(open_storage(str(cache_copy))))
    _assert_matches(_by_key(records), jax_caches["zstd"].manifest)
    orphans = [r for r in records if isinstance(r, Orphan)]
    assert [o.key for o in orphans] == [ORPHAN_KEY]
    assert len(records) == len(jax_caches["zstd"].entries) + 1  # nothing from .jaxcache/, .lockfile, etc.


def test_scan_is_a_stream(cache_copy):
    it = scan(open_storage(str(cache_copy)))
    assert iter(it) is it
    first = next(it)
    assert isinstance(first, Entry | Orphan)


def test_scan_without_headers_reads_no_entry_bytes(cache_copy):
    for r in scan(open_storage(str(cache_copy)), read_headers=False):
        assert r.compile_seconds is None and r.status is None


def test_last_used_comes_from_atime(cache_copy, jax_caches):
    key = jax_caches["zstd"].entries[0]["key"]
    future_ns = (int(os.path.getmtime(cache_copy / (key + "-cache"))) + 3600) * 10**9
    (cache_copy / (key + "-atime")).write_bytes(fmt.encode_atime(future_ns))
    got = _by_key(scan(open_storage(str(cache_copy))))[key]
    assert got.atime_ns == future_ns and got.last_used_s == future_ns / 1e9


def test_corrupt_entry_is_reported_not_raised(cache_copy, jax_caches):
    victim = jax_caches["zstd"].entries[0]
    (cache_copy / victim["file"]).write_bytes(b"")
    (cache_copy / jax_caches["zstd"].entries[1]["file"]).write_bytes(b"\x00" * 100)
    got = _by_key(scan(open_storage(str(cache_copy))))
    assert got[victim["key"]].status is Status.CORRUPT and "empty" in got[victim["key"]].reason
    assert got[jax_caches["zstd"].entries[1]["key"]].status is Status.CORRUPT


@pytest.mark.parametrize("compression", ["zstd", "zlib"])
def test_scan_of_an_object_store_matches_local(store_root, jax_caches, compression):
    put_dir(store_root, jax_caches[compression].root)
    raw_put(store_root, f"{ORPHAN_KEY}-atime", fmt.encode_atime(1))
    raw_put(store_root, ".jaxcache/runs/r-p0.json", b"{}")
    raw_put(store_root + "-other", "jit_x-" + "1" * 64 + "-cache", b"outside the prefix")
    records = list(scan(open_storage(store_root)))
    _assert_matches(_by_key(records), jax_caches[compression].manifest)
    assert [o.key for o in records if isinstance(o, Orphan)] == [ORPHAN_KEY]
    assert all(isinstance(r, Orphan) or r.version for r in records)


@pytest.mark.slow
def test_jax_writes_an_object_store_and_jaxcache_lists_it(store_root, tmp_path):
    """Plain JAX, no client, writes a cache straight to each store through etils epath and fsspec (gcsfs, s3fs,
    adlfs: the environment points them at the test's server as it points boto3 and the others); the scanner finds
    exactly what it wrote, and `jaxcache ls` and the service list it like any other."""
    written = run_writer(sys.executable, store_root, tmp_path / "m.json")
    records = list(scan(open_storage(store_root)))
    _assert_matches(_by_key(records), written.manifest)
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "ls", store_root, "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {e["key"] for e in json.loads(proc.stdout)["entries"]} == {e["key"] for e in written.entries}
    # And the service catalogs them.
    from fastapi.testclient import TestClient

    from jaxcache.service.app import create_app
    from reports_support import H_READ, rescan, settings

    with TestClient(create_app(settings(tmp_path, {"plain": store_root}))) as client:
        rescan(client, "plain")
        listed = client.get("/v1/caches/plain/entries?limit=1000", headers=H_READ).json()["entries"]
    assert {e["key"] for e in listed} == {e["key"] for e in written.entries}
    assert all(e["status"] == "ok" and e["version"] for e in listed)
