"""`ls` and `stats` decide by one rule whether to read entries' heads (#61): on a directory by default, in every
object store (gs://, s3://, az://, each on its emulator) only with --heads (or `ls --sort compile`), since each head
is a request there. Without heads, the figures that need them say "not read" (null in --json), whatever the head
index holds; the rest come from the listing."""

from __future__ import annotations

from pathlib import Path

import pytest

from head_index_support import index_snapshot, run_json
from jaxcache.cli import main
from jaxcache.storage import open_storage
from store_servers import BUCKETS

#: What `stats --json` reports only from heads.
HEAD_FIGURES = ("heads_read", "compile_seconds", "compression", "mixed_compression", "corrupt", "by_function")


@pytest.fixture(params=sorted(BUCKETS))
def store_root(request, jax_caches) -> str:
    """The zstd cache (entries and their -atime files) in a fresh bucket of each object store."""
    bucket = request.getfixturevalue(BUCKETS[request.param])
    root = f"{request.param}://{bucket}/jc"
    storage = open_storage(root)
    for path in sorted(Path(jax_caches["zstd"].root).iterdir()):
        if path.is_file():
            storage.write_atomic(path.name, path.read_bytes())
    return root


def _without_heads(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k not in HEAD_FIGURES} | {
        "by_function": [{k: v for k, v in f.items() if k != "compile_seconds"} for f in stats["by_function"]]}


def test_ls_and_stats_read_no_head_in_an_object_store_unless_asked(capsys, store_root, jax_caches, index_dir):
    entries = jax_caches["zstd"].entries
    n = len(entries)
    stats, _ = run_json(capsys, "stats", store_root)
    assert stats["heads_read"] is False and stats["entries"] == n
    assert stats["size_bytes"] == sum(e["size_bytes"] for e in entries)
    assert stats["with_atime"] == sum(e["has_atime"] for e in entries) > 0
    assert stats["compile_seconds"] is None and stats["compression"] is None and stats["corrupt"] is None
    assert stats["mixed_compression"] is None and all(f["compile_seconds"] is None for f in stats["by_function"])
    assert all(e.status is None for e in index_snapshot(store_root).entries)  # no head was read
    listing, _ = run_json(capsys, "ls", store_root)
    assert listing["heads_read"] is False and len(listing["entries"]) == n
    assert all(e["status"] is None and e["compile_seconds"] is None for e in listing["entries"])

    with_heads, _ = run_json(capsys, "stats", store_root, "--heads")
    assert with_heads["heads_read"] is True and with_heads["compression"] == {"zstd": n} and with_heads["corrupt"] == 0
    assert with_heads["compile_seconds"] == sum(e["stored_compile_seconds"] for e in entries)
    assert _without_heads(with_heads) == _without_heads(stats)
    assert run_json(capsys, "ls", store_root, "--heads")[0]["heads_read"] is True
    assert run_json(capsys, "ls", store_root, "--sort", "compile")[0]["heads_read"] is True

    # The index holds every head now; a call without --heads still says what it says without an index.
    assert run_json(capsys, "stats", store_root)[0] == stats == run_json(capsys, "stats", store_root, "--no-index")[0]
    assert run_json(capsys, "ls", store_root)[0] == listing
    assert main(["stats", store_root]) == 0
    out = capsys.readouterr().out
    assert "stored compile s        not read" in out and "corrupt (header check)  not read" in out
    assert "--heads shows compile seconds, the compression mix and corrupt entries" in out


def test_on_a_directory_both_read_heads_unless_told_not_to(capsys, cache_copy, jax_caches, index_dir):
    n = len(jax_caches["zstd"].entries)
    stats, _ = run_json(capsys, "stats", str(cache_copy))
    assert stats["heads_read"] is True and stats["compression"] == {"zstd": n} and stats["corrupt"] == 0
    assert run_json(capsys, "ls", str(cache_copy))[0]["heads_read"] is True
    unread, _ = run_json(capsys, "stats", str(cache_copy), "--no-heads")
    assert unread["heads_read"] is False and unread["compile_seconds"] is None
    assert _without_heads(unread) == _without_heads(stats)
