"""The head index of `jaxcache ls`/`stats`: a second listing reads nothing, what changed is read again, and the
answers are the ones a listing without the index gives, on directories (GCS: test_head_index_gcs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec

from head_index_support import by_key, forget_answers, garble_keeping_stamp, index_snapshot, listed, run_json
from jaxcache import entry as fmt
from jaxcache.head_index import UNUSED_DAYS, HeadIndex, sweep
from jaxcache.scan import Orphan, read_head, scan
from jaxcache.storage import open_storage

# --- directories ---------------------------------------------------------------------------------------------


def test_second_listing_reads_no_entry(cache_copy, jax_caches, index_dir):
    first, reads_first = listed(str(cache_copy))
    n = len(jax_caches["zstd"].entries)
    assert reads_first == 2 * n  # every head and every -atime file
    second, reads_second = listed(str(cache_copy))
    assert reads_second == 0
    assert sorted(second, key=lambda r: r.name) == sorted(first, key=lambda r: r.name)


def test_the_index_answers_until_size_or_mtime_changes(capsys, cache_copy, jax_caches, index_dir):
    root = str(cache_copy)
    before, _ = run_json(capsys, "ls", root)
    victim = jax_caches["zstd"].entries[0]
    path = cache_copy / victim["file"]
    garble_keeping_stamp(path)
    again, _ = run_json(capsys, "ls", root)
    assert again == before  # answered from the index: the garbage was not read
    assert by_key(again)[victim["key"]]["status"] == "ok"

    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))
    changed, _ = run_json(capsys, "ls", root)
    got = by_key(changed)[victim["key"]]
    assert got["status"] == "corrupt" and got["compile_seconds"] is None and "not a zstd or zlib" in got["reason"]
    assert got["created_s"] == path.stat().st_mtime
    others = {k: v for k, v in by_key(changed).items() if k != victim["key"]}
    assert others == {k: v for k, v in by_key(before).items() if k != victim["key"]}

    second = jax_caches["zstd"].entries[1]
    path2 = cache_copy / second["file"]
    st = path2.stat()
    path2.write_bytes(path2.read_bytes()[: st.st_size // 2])  # a new size, even with the old mtime
    os.utime(path2, ns=(st.st_atime_ns, st.st_mtime_ns))
    stats, _ = run_json(capsys, "stats", root)
    assert stats["corrupt"] == 2
    assert by_key(run_json(capsys, "ls", root)[0])[second["key"]]["size_bytes"] == st.st_size // 2


def test_ls_and_the_services_rescans_take_the_same_objects_as_unchanged(capsys, cache_copy, jax_caches, index_dir):
    """`jaxcache ls` (its head index) and a rescan's listing (``list_changes``) decide "the same object" by one rule:
    other bytes under the same size and mtime are the same object to both, a new mtime or a new size a changed one
    to both."""
    root = str(cache_copy)
    run_json(capsys, "ls", root)
    storage = open_storage(root)
    listing, _ = storage.list_changes({})
    same, touched, resized = (cache_copy / e["file"] for e in jax_caches["zstd"].entries[:3])
    garble_keeping_stamp(same)
    garble_keeping_stamp(touched)
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 1_000_000_000))
    st = resized.stat()
    resized.write_bytes(resized.read_bytes()[: st.st_size // 2])
    os.utime(resized, ns=(st.st_atime_ns, st.st_mtime_ns))

    changed, _ = storage.list_changes(listing)
    reread = {e["key"] + "-cache" for e in run_json(capsys, "ls", root)[0]["entries"] if e["status"] == "corrupt"}
    assert {n for n in changed if n.endswith("-cache")} == reread == {touched.name, resized.name}, (changed, reread)


def test_new_changed_atime_and_deleted_entries(capsys, cache_copy, jax_caches, index_dir):
    root = str(cache_copy)
    entries = jax_caches["zstd"].entries
    run_json(capsys, "ls", root)
    # A new entry (another key with real bytes), a rewritten -atime file, a deleted entry.
    new_key = entries[0]["module"] + "-" + "e" * 64
    (cache_copy / (new_key + "-cache")).write_bytes((cache_copy / entries[0]["file"]).read_bytes())
    later_ns = (int((cache_copy / entries[1]["file"]).stat().st_mtime) + 7200) * 10**9
    (cache_copy / (entries[1]["key"] + "-atime")).write_bytes(fmt.encode_atime(later_ns))
    gone = entries[2]
    (cache_copy / gone["file"]).unlink()
    (cache_copy / (gone["key"] + "-atime")).unlink()

    alone = open_storage(root)
    read_head(alone, alone.stat(new_key + "-cache"))
    records, reads = listed(root)
    assert reads == alone.reads + 1  # the new entry's head, and the rewritten -atime file
    data, _ = run_json(capsys, "ls", root)
    got = by_key(data)
    assert gone["key"] not in got
    assert got[new_key]["status"] == "ok" and got[new_key]["compile_seconds"] == entries[0]["stored_compile_seconds"]
    assert got[new_key]["has_atime"] is False
    assert got[entries[1]["key"]]["last_used_s"] == later_ns / 1e9
    snapshot = index_snapshot(root)
    assert gone["key"] not in {e.key for e in snapshot.entries}  # vanished entries drop out of the index too
    assert new_key in {e.key for e in snapshot.entries}


def test_outputs_equal_those_without_the_index(capsys, cache_copy, jax_caches, index_dir):
    root = str(cache_copy)
    (cache_copy / ("jit_gone-" + "0" * 64 + "-atime")).write_bytes(fmt.encode_atime(1))  # an orphan
    (cache_copy / jax_caches["zstd"].entries[0]["file"]).write_bytes(b"")  # a corrupt entry
    for argv in (["ls", root], ["ls", root, "--sort", "size"], ["ls", root, "--sort", "compile", "--limit", "3"],
                 ["ls", root, "--sort", "age", "--function", "jit_*"], ["stats", root]):
        without, _ = run_json(capsys, *argv, "--no-index")
        first, _ = run_json(capsys, *argv)
        second, _ = run_json(capsys, *argv)
        assert first == without and second == without, argv
    stats, _ = run_json(capsys, "stats", root)
    assert stats["orphans"] == 1 and stats["corrupt"] == 1
    assert [type(r) for r in listed(root)[0]].count(Orphan) == 1


def test_index_off_reads_every_head(capsys, cache_copy, jax_caches, index_dir, monkeypatch):
    root = str(cache_copy)
    run_json(capsys, "ls", root)
    victim = jax_caches["zstd"].entries[0]
    garble_keeping_stamp(cache_copy / victim["file"])
    for how in ("env", "flag"):
        if how == "env":
            monkeypatch.setenv("JAXCACHE_INDEX", "off")
            data, _ = run_json(capsys, "ls", root)
            assert HeadIndex.for_storage(open_storage(root)) is None
        else:
            monkeypatch.delenv("JAXCACHE_INDEX")
            data, _ = run_json(capsys, "ls", root, "--no-index")
        assert by_key(data)[victim["key"]]["status"] == "corrupt", how
    storage = open_storage(root)
    list(scan(storage))
    assert storage.reads == 2 * len(jax_caches["zstd"].entries)


def test_the_index_lives_outside_the_root(capsys, cache_copy, index_dir, monkeypatch):
    root = str(cache_copy)
    before = sorted(str(p.relative_to(cache_copy)) for p in cache_copy.rglob("*"))
    run_json(capsys, "ls", root)
    run_json(capsys, "stats", root)
    assert sorted(str(p.relative_to(cache_copy)) for p in cache_copy.rglob("*")) == before
    # The index, and the last answer of each command (jaxcache.answers).
    assert sorted(p.suffix for p in index_dir.iterdir()) == [".heads", ".ls", ".stats"]

    # Pointed inside the root, it is not used (and not written there), with a warning.
    monkeypatch.setenv("JAXCACHE_INDEX_DIR", str(cache_copy / "sub"))
    _, err = run_json(capsys, "ls", root)
    assert "inside the cache root" in err and err.count("warning") == 1
    assert not (cache_copy / "sub").exists()


def test_default_location_is_the_users_cache_directory(tmp_path, monkeypatch, cache_copy):
    monkeypatch.delenv("JAXCACHE_INDEX_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    index = HeadIndex.for_storage(open_storage(str(cache_copy)))
    assert index is not None and Path(index.path).parent == tmp_path / "xdg" / "jaxcache" / "heads"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    index = HeadIndex.for_storage(open_storage(str(cache_copy)))
    assert index is not None and Path(index.path).parent == tmp_path / "home" / ".cache" / "jaxcache" / "heads"


def test_a_corrupt_index_is_ignored_with_one_warning_and_rebuilt(capsys, cache_copy, jax_caches, index_dir):
    root = str(cache_copy)
    expected, _ = run_json(capsys, "stats", root, "--no-index")
    run_json(capsys, "stats", root)
    (path,) = index_dir.glob("*.heads")
    for garbage in (path.read_bytes()[:1000], b"not an index at all", b""):
        path.write_bytes(garbage)
        forget_answers(index_dir)  # else the kept answer is given without reading the index
        got, err = run_json(capsys, "stats", root)
        assert got == expected
        assert err.count("warning") == 1 and "corrupt head index" in err, garbage[:20]
        assert index_snapshot(root).entries  # written anew
        again, err = run_json(capsys, "stats", root)
        assert again == expected and err == ""


def test_a_fifo_in_the_index_s_place_is_passed_over_with_one_warning(cache_copy, index_dir):
    # JAXCACHE_INDEX_DIR is a folder a user names: a FIFO under the index's name would hang a reader that opens it
    # plainly (open() waits for a writer). The listing answers, reading every head, and says why once.
    root = str(cache_copy)
    env = {**os.environ, "JAXCACHE_INDEX_DIR": str(index_dir)}
    cli = [sys.executable, "-m", "jaxcache", "stats", root, "--json"]
    subprocess.run(cli, env=env, check=True, capture_output=True, timeout=60)
    (path,) = index_dir.glob("*.heads")
    path.unlink()
    os.mkfifo(path)
    forget_answers(index_dir)
    done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("warning") == 1 and "not a regular file" in done.stderr, done.stderr


def test_an_index_whose_parts_disagree_is_ignored_with_one_warning(capsys, cache_copy, jax_caches, index_dir):
    root = str(cache_copy)
    run_json(capsys, "ls", root)
    index = HeadIndex.for_storage(open_storage(root))
    assert index is not None
    snapshot = index.load()
    assert snapshot is not None
    snapshot.atime_stamps = msgspec.Raw(msgspec.msgpack.encode([]))
    index.save(snapshot)
    path = cache_copy / jax_caches["zstd"].entries[0]["file"]
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # not the indexed listing
    got, err = run_json(capsys, "ls", root)
    assert got == run_json(capsys, "ls", root, "--no-index")[0]
    assert err.count("warning") == 1 and "0 -atime stamps" in err


def test_another_format_version_is_replaced_silently(capsys, cache_copy, index_dir):
    root = str(cache_copy)
    run_json(capsys, "ls", root)
    (path,) = index_dir.glob("*.heads")
    data = path.read_bytes()
    path.write_bytes(b"jaxcache head index v0 000000000000\n" + data[data.index(b"\n") + 1 :])
    forget_answers(index_dir)
    _, err = run_json(capsys, "ls", root)
    assert err == ""
    assert listed(root)[1] == 0  # rebuilt in our format


def test_an_unwritable_index_warns_and_still_answers(capsys, cache_copy, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("JAXCACHE_INDEX_DIR", str(blocker / "index"))  # under a file: cannot be created
    data, err = run_json(capsys, "ls", str(cache_copy))
    assert data["entries"] and err.count("warning") == 1 and "cannot save the head index" in err


def test_concurrent_listings_leave_a_whole_index(cache_copy, jax_caches, index_dir):
    root = str(cache_copy)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            for _ in range(5):
                listed(root)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(index_snapshot(root).entries) == len(jax_caches["zstd"].entries)
    assert [p.name for p in index_dir.iterdir() if p.name.startswith(".tmp-")] == []
    assert listed(root)[1] == 0


_FORKED_LISTING = """
import json, multiprocessing.pool, sys
import jaxcache.scan_indexed as indexed
from jaxcache.head_index import HeadIndex
from jaxcache.storage import open_storage
indexed.FORK_MIN_READS, indexed._FORK_CHUNK = 2, 2
pools = []
init = multiprocessing.pool.Pool.__init__
multiprocessing.pool.Pool.__init__ = lambda self, *a, **k: (pools.append(1), init(self, *a, **k))[1]
storage = open_storage(sys.argv[1])
records = list(indexed.scan_indexed(storage, HeadIndex.for_storage(storage)))
print(json.dumps({"pools": len(pools), "reads": storage.reads,
                  "records": sorted([r.name, r.size_bytes, getattr(r, "status", None)] for r in records)}))
"""


def test_a_first_listing_reads_heads_in_forked_workers_as_one_process_would(cache_copy, jax_caches, index_dir,
                                                                            tmp_path):
    """Many heads to read on a directory: worker processes decompress them (the GIL keeps threads from it), and
    the records, the index and the count of reads are the ones a scan in this process gives. In a fresh process:
    this one runs other tests' threads, and a scan forks only where no other thread runs."""
    root = str(cache_copy)
    serial, serial_reads = listed(root)
    env = {**os.environ, "JAXCACHE_INDEX_DIR": str(tmp_path / "forked-index")}
    done = subprocess.run([sys.executable, "-c", _FORKED_LISTING, root], env=env, capture_output=True, text=True,
                          check=True, timeout=120)
    forked = json.loads(done.stdout)
    assert forked["pools"] == 1 and forked["reads"] == serial_reads == 2 * len(jax_caches["zstd"].entries)
    assert forked["records"] == sorted([r.name, r.size_bytes, getattr(r, "status", None)] for r in serial)
    env_index = HeadIndex(str(next((tmp_path / "forked-index").glob("*.heads"))), open_storage(root).identity)
    snapshot = env_index.load()
    assert snapshot is not None and len(snapshot.entries) == len(jax_caches["zstd"].entries)  # saved by the parent


def test_the_files_of_roots_nobody_lists_are_swept(capsys, cache_copy, tmp_path, index_dir):
    root, other = str(cache_copy), tmp_path / "other"
    other.mkdir()
    run_json(capsys, "ls", root)
    mine = sorted(os.listdir(index_dir))
    assert any(n.endswith(".heads") for n in mine) and any(n.endswith(".ls") for n in mine)
    long_ago = time.time() - (UNUSED_DAYS + 1) * 86400
    stale = ["a" * 32 + ".heads", "a" * 32 + ".ls", "b" * 32 + ".stats", ".tmp-crashed"]
    kept = ["c" * 32 + ".heads", "c" * 32 + ".ls", "notes.txt", ".tmp-being-written"]
    for name in stale + kept:
        (index_dir / name).write_bytes(b"x")
    for name in [*stale, "c" * 32 + ".ls", "notes.txt", *mine]:
        os.utime(index_dir / name, (long_ago, long_ago))
    # A listing answered from what is kept saves nothing and sweeps nothing, but marks its own root's index used.
    run_json(capsys, "ls", root)
    assert set(os.listdir(index_dir)) == {*mine, *stale, *kept}
    run_json(capsys, "ls", str(other))  # a new root's index is saved: the others are swept
    left = set(os.listdir(index_dir))
    assert not left & set(stale) and set(mine) | set(kept) <= left, sorted(left)
    assert sweep(str(index_dir)) == []
