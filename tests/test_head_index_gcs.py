"""The head index on GCS (fake-gcs-server): `ls` reads no object unless a figure needs heads, then each object
version once, a small entry's head in one GET, and one index per endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import upload_dir
from head_index_support import index_snapshot, listed, run_json
from jaxcache import entry as fmt
from jaxcache.cli import main
from jaxcache.scan import Entry, scan
from jaxcache.storage import open_storage


@pytest.fixture
def gcs_roots(gcs_client, gcs_bucket, jax_caches, tmp_path, index_dir) -> dict[str, str]:
    """The zstd cache on GCS twice: as JAX writes there (no -atime files: its LRU is off on object stores) and with
    its -atime files (a job that set a cache size)."""
    plain = tmp_path / "plain"
    plain.mkdir()
    for e in jax_caches["zstd"].entries:
        (plain / e["file"]).write_bytes(Path(jax_caches["zstd"].root, e["file"]).read_bytes())
    upload_dir(gcs_client, gcs_bucket, "plain", plain)
    upload_dir(gcs_client, gcs_bucket, "lru", jax_caches["zstd"].root)
    return {"plain": f"gs://{gcs_bucket}/plain", "lru": f"gs://{gcs_bucket}/lru"}


@pytest.mark.gcs
def test_gcs_ls_reads_no_object_without_head_figures(capsys, gcs_roots, jax_caches):
    n = len(jax_caches["zstd"].entries)
    assert listed(gcs_roots["plain"], read_headers=False)[1] == 0
    assert listed(gcs_roots["lru"], read_headers=False)[1] == n  # each -atime file, once
    assert listed(gcs_roots["lru"], read_headers=False)[1] == 0

    data, _ = run_json(capsys, "ls", gcs_roots["plain"], "--sort", "size")
    assert data["heads_read"] is False and len(data["entries"]) == n
    assert all(e["compression"] is None and e["status"] is None for e in data["entries"])
    assert all(e.status is None for e in index_snapshot(gcs_roots["plain"]).entries)  # no head was read
    code = main(["ls", gcs_roots["plain"]])
    out, _ = capsys.readouterr()
    assert code == 0 and "--heads shows compile seconds" in out

    with_heads, _ = run_json(capsys, "ls", gcs_roots["plain"], "--heads")
    assert with_heads["heads_read"] is True and all(e["status"] == "ok" for e in with_heads["entries"])
    by_sort, _ = run_json(capsys, "ls", gcs_roots["plain"], "--sort", "compile")
    assert by_sort["heads_read"] is True
    assert main(["ls", gcs_roots["plain"], "--sort", "compile", "--no-heads"]) == 2
    assert "needs every entry's head" in capsys.readouterr().err


@pytest.mark.gcs
def test_gcs_reads_a_small_entrys_head_in_one_get(gcs_roots, jax_caches):
    entries = jax_caches["zstd"].entries
    storage = open_storage(gcs_roots["plain"])
    small = [e for e in entries if 256 < e["size_bytes"] <= storage.head_whole_bytes]
    assert small, [e["size_bytes"] for e in entries]  # most programs JAX writes are a few KiB
    heads = {r.key: r for r in scan(storage) if isinstance(r, Entry)}
    assert storage.reads == len(small) + 2 * (len(entries) - len(small))
    # Asking for 256 bytes first, as for a bigger entry, takes a second GET to the end of the first block, and
    # finds the same head.
    split = open_storage(gcs_roots["plain"])
    split.head_whole_bytes = 0
    again = {r.key: r for r in scan(split) if isinstance(r, Entry)}
    assert split.reads == 2 * len(entries)
    assert again == heads and all(r.status == "ok" and r.compile_seconds is not None for r in heads.values())


@pytest.mark.gcs
def test_gcs_stats_reads_each_object_version_once(capsys, gcs_client, gcs_bucket, gcs_roots, jax_caches):
    root = gcs_roots["lru"]
    n = len(jax_caches["zstd"].entries)
    expected, _ = run_json(capsys, "stats", root, "--heads", "--no-index")
    plain = open_storage(root)
    assert sum(isinstance(r, Entry) for r in scan(plain)) == n
    assert listed(root)[1] == plain.reads  # heads (one or two ranged GETs each) and -atime files, as without it
    assert listed(root)[1] == 0
    assert run_json(capsys, "stats", root, "--heads")[0] == expected

    # A rewritten object is a new version (its generation): read again, whatever its size.
    victim = jax_caches["zstd"].entries[0]
    blob = gcs_client.bucket(gcs_bucket).blob(f"lru/{victim['file']}")
    blob.upload_from_string(b"\x01" * victim["size_bytes"])
    records, reads = listed(root)
    assert reads == 1  # its first read is garbage: not zstd, nothing more to read
    got = {r.key: r for r in records if isinstance(r, Entry)}[victim["key"]]
    assert got.status is fmt.Status.CORRUPT and got.version == str(gcs_client.bucket(gcs_bucket).get_blob(
        f"lru/{victim['file']}").generation)
    stats, _ = run_json(capsys, "stats", root, "--heads")
    assert stats["corrupt"] == 1 and stats == run_json(capsys, "stats", root, "--heads", "--no-index")[0]
    ls_index, _ = run_json(capsys, "ls", root, "--heads")
    assert ls_index == run_json(capsys, "ls", root, "--heads", "--no-index")[0]


@pytest.mark.gcs
def test_gcs_index_is_per_endpoint(gcs_roots):
    storage = open_storage(gcs_roots["plain"])
    assert storage.identity.startswith(gcs_roots["plain"] + " at http://127.0.0.1:")
