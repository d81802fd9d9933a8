"""A cache root nobody can jam (#32): FIFOs, sockets, links out of the root, folders and empty files named like
entries, names a backend cannot read and names that disguise themselves. `ls`, `stats`, `doctor` and `prune` (a dry
run and `--apply`) answer in bounded time on such a root, skip and count what they cannot read, and lose nothing.

Local commands run as processes with a timeout: a reader blocked in open() on a FIFO is the failure they catch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jaxcache import entry as fmt
from jaxcache.cli import main
from jaxcache.display import shown

TIMEOUT_S = 60
DAY = 86400.0
BIDI_MODULE = "jit_\u202eevil\u202d"  # shows as "jit_live" where the override is obeyed


def key_of(module: str, tag: str) -> str:
    return f"{module}-{hashlib.sha256(tag.encode()).hexdigest()}"


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """`jaxcache ARGV` as a process; a hang past TIMEOUT_S fails the test (TimeoutExpired)."""
    return subprocess.run([sys.executable, "-m", "jaxcache", *argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, "PYTHONIOENCODING": "utf-8"})


def make_socket(path: Path) -> None:
    # A socket's path may be at most 107 bytes: bind it by its name, from its folder.
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path.name)
        s.close()
    finally:
        os.chdir(here)


@pytest.fixture
def hostile(tmp_path, jax_caches):
    """A copy of a real zstd cache (JAX's LRU on: -atime files) with every kind of jam added, and what to expect."""
    root = tmp_path / "cache"
    shutil.copytree(jax_caches["zstd"].root, root)
    real = sorted(e["key"] for e in jax_caches["zstd"].entries)
    data = (root / f"{real[0]}-cache").read_bytes()
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_bytes(fmt.encode_atime(time.time_ns()))  # 8 bytes that would decode as an -atime
    (outside / "entry-cache").write_bytes(data)

    fifo_atime, link_atime, dir_atime, empty_atime = real[1], real[2], real[3], real[4]
    for key in (fifo_atime, link_atime, dir_atime, empty_atime):
        (root / f"{key}-atime").unlink()
    os.mkfifo(root / f"{fifo_atime}-atime")
    (root / f"{link_atime}-atime").symlink_to(secret)
    (root / f"{dir_atime}-atime").mkdir()
    (root / f"{empty_atime}-atime").write_bytes(b"")

    skipped = {
        f"{fifo_atime}-atime": "a FIFO",
        f"{link_atime}-atime": "a symbolic link",
        f"{dir_atime}-atime": "a directory",
        key_of("jit_fifo", "1") + "-cache": "a FIFO",
        key_of("jit_sock", "2") + "-cache": "a socket",
        key_of("jit_link", "3") + "-cache": "a symbolic link",
        key_of("jit_dir", "4") + "-cache": "a directory",
        key_of("jit_a\\b", "5") + "-cache": "not a relative path",
    }
    os.mkfifo(root / (key_of("jit_fifo", "1") + "-cache"))
    make_socket(root / (key_of("jit_sock", "2") + "-cache"))
    (root / (key_of("jit_link", "3") + "-cache")).symlink_to(outside / "entry-cache")
    (root / (key_of("jit_dir", "4") + "-cache")).mkdir()
    (root / (key_of("jit_a\\b", "5") + "-cache")).write_bytes(data)
    # Entries that are odd but real files: listed as they are.
    empty = key_of("jit_empty", "6")
    (root / f"{empty}-cache").write_bytes(b"")  # a write that never finished: corrupt
    bidi = key_of(BIDI_MODULE, "7")
    (root / f"{bidi}-cache").write_bytes(data)
    old = time.time() - 40 * DAY  # everything unused for 40 days: every entry is a candidate
    for path in root.iterdir():
        if path.is_file() and not path.is_symlink() and path.name.endswith(("-cache", "-atime")):
            os.utime(path, (old, old))
            if path.name.endswith("-atime") and path.stat().st_size:
                path.write_bytes(fmt.encode_atime(int(old * 1e9)))
                os.utime(path, (old, old))
    return {
        "root": root, "secret": secret, "entries": sorted([*real, empty, bidi]), "skipped": skipped,
        "without_atime": {fifo_atime, link_atime, dir_atime, empty_atime, empty, bidi}, "empty": empty, "bidi": bidi,
        "dir_atime": dir_atime,
    }


def test_ls_and_stats_list_every_real_entry_and_count_the_rest(hostile):
    root = str(hostile["root"])
    for extra in ((), ("--no-index",)):
        proc = cli("ls", root, "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert sorted(e["key"] for e in data["entries"]) == hostile["entries"]
        assert {e["key"] for e in data["entries"] if not e["has_atime"]} == hostile["without_atime"]
        assert data["skipped"] == len(hostile["skipped"])

    # The root itself may be a link: only what is under it is not followed.
    link = hostile["root"].parent / "link-to-root"
    link.symlink_to(hostile["root"])
    proc = cli("ls", str(link), "--json", "--no-index")
    assert proc.returncode == 0, proc.stderr
    assert sorted(e["key"] for e in json.loads(proc.stdout)["entries"]) == hostile["entries"]

    proc = cli("stats", root, "--json")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert (s["entries"], s["corrupt"], s["skipped"]) == (len(hostile["entries"]), 1, len(hostile["skipped"]))
    proc = cli("stats", root)
    assert proc.returncode == 0 and re.search(rf"skipped +{len(hostile['skipped'])} objects", proc.stdout)


def test_names_show_escaped_in_tables(hostile):
    proc = cli("ls", str(hostile["root"]))
    assert proc.returncode == 0, proc.stderr
    assert "jit_\\u202eevil\\u202d" in proc.stdout and "\u202e" not in proc.stdout
    assert f"skipped {len(hostile['skipped'])} objects" in proc.stdout
    proc = cli("stats", str(hostile["root"]))
    assert "jit_\\u202eevil\\u202d" in proc.stdout and "\u202e" not in proc.stdout


def test_shown_escapes_what_disguises_and_keeps_the_rest():
    assert shown("jit_train_step") == "jit_train_step"
    assert shown("jit_\u202eevil\u202d") == "jit_\\u202eevil\\u202d"
    assert shown("a\x1b[2Jb\nc\u200bd") == "a\\x1b[2Jb\\x0ac\\u200bd"
    assert shown("jit_a\\u202e") == "jit_a\\\\u202e"  # a backslash is doubled: an escape cannot be faked
    assert shown("jit_f\u00fcr_\u65e5\u672c") == "jit_f\u00fcr_\u65e5\u672c"  # other scripts stay readable
    assert shown("jit_\udcff") == "jit_\\udcff"  # undecodable bytes of a file name


def test_doctor_lists_what_it_skipped(hostile):
    root = str(hostile["root"])
    proc = cli("doctor", root, "--json")
    assert proc.returncode == 1, proc.stderr  # problems: a corrupt entry, skipped objects
    d = json.loads(proc.stdout)
    assert d["checked"] == len(hostile["entries"])
    assert [c["key"] for c in d["corrupt"]] == [hostile["empty"]]
    assert d["skipped_total"] == len(hostile["skipped"])
    reasons = {s["name"]: s["reason"] for s in d["skipped"]}
    assert reasons.keys() == hostile["skipped"].keys()
    for name, what in hostile["skipped"].items():
        assert what in reasons[name], (name, reasons[name])

    proc = cli("doctor", root)
    assert proc.returncode == 1, proc.stderr
    assert f"skipped, not read ({len(hostile['skipped'])})" in proc.stdout
    assert shown(key_of("jit_a\\b", "5") + "-cache") in proc.stdout  # the backslash doubled

    proc = cli("doctor", root, "--verify", "--json")
    assert proc.returncode == 1, proc.stderr  # the empty entry is corrupt
    v = json.loads(proc.stdout)
    assert v["checked"] == len(hostile["entries"]) and v["skipped_total"] == len(hostile["skipped"])


def test_prune_dry_run_and_apply_delete_only_real_entries(hostile):
    root = hostile["root"]
    policy = ("--unused-for", "30d", "--min-age", "0s")
    proc = cli("prune", str(root), *policy, "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert sorted(d["key"] for d in plan["delete"]) == hostile["entries"]
    assert plan["skipped"] == len(hostile["skipped"])
    proc = cli("prune", str(root), *policy)
    assert proc.returncode == 0 and "jit_\\u202eevil\\u202d" in proc.stdout and "\u202e" not in proc.stdout

    proc = cli("prune", str(root), *policy, "--apply", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert (result["deleted"], result["errors"]) == (len(hostile["entries"]), [])
    left = {p.name for p in root.iterdir()}
    assert not any(f"{key}-cache" in left for key in hostile["entries"])
    # The links, FIFOs and folders named like entries were never entries: still there, or (an entry's own -atime
    # name) removed without following it; what a link pointed at outside the root is untouched.
    for name in hostile["skipped"]:
        if not name.endswith("-atime"):
            assert name in left, name
    assert f"{hostile['dir_atime']}-atime" in left  # a folder is not unlinked
    assert hostile["secret"].read_bytes() and (hostile["secret"].parent / "entry-cache").stat().st_size


READS = textwrap.dedent("""
    import os, sys
    from jaxcache.errors import NotRegularFileError
    from jaxcache.storage import open_storage
    root = sys.argv[1]
    storage = open_storage(root)
    listed = [o[0] for o in storage.list_stats(("-cache",))]
    os.replace(os.path.join(root, "fifo"), os.path.join(root, listed[0]))  # swapped in after the listing
    out = []
    for read in (lambda n: storage.read_range(n, 0, 8), storage.read, storage.read_chunks, storage.stat):
        for name in (listed[0], "link-atime", "dir-atime", ".jaxcache/runs/day/r.json"):
            try:
                out.append(repr(read(name)))
            except NotRegularFileError:
                out.append("skipped")
    print(" ".join(out))
    print(storage.skipped.count)
""")


def test_storage_never_opens_what_is_not_a_regular_file(tmp_path, jax_caches):
    root = tmp_path / "cache"
    shutil.copytree(jax_caches["zstd"].root, root)
    outside = tmp_path / "outside"
    (outside / "day").mkdir(parents=True)
    (outside / "day" / "r.json").write_text("{}")
    os.mkfifo(root / "fifo")
    (root / "link-atime").symlink_to("/etc/passwd")
    (root / "dir-atime").mkdir()
    (root / ".jaxcache").mkdir()
    (root / ".jaxcache" / "runs").symlink_to(outside)  # a folder on the way that leads out of the root
    proc = subprocess.run([sys.executable, "-c", READS, str(root)], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    results, count = proc.stdout.split("\n")[:2]
    # read_range, read, read_chunks raise; stat says there is no such object; neither follows nor waits.
    assert results.split() == ["skipped"] * 12 + ["None"] * 4
    assert int(count) == 4


def test_records_with_links_or_fifos_do_not_stop_prune(tmp_path, jax_caches):
    root = tmp_path / "cache"
    shutil.copytree(jax_caches["zstd"].root, root)
    runs = root / ".jaxcache" / "runs" / "2026-01-01"
    runs.mkdir(parents=True)
    os.mkfifo(runs / "r-p0.json")
    (runs / "r-p1.json").symlink_to("/etc/passwd")
    (runs / "r-p2.json").mkdir()
    proc = cli("prune", str(root), "--max-size", "1GiB", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["run_records"]["read"] == 0 and data["skipped"] == 3


@pytest.fixture
def hostile_bucket(store_root, jax_caches):
    """A real zlib cache in each object store, with an entry and run records whose names no backend may read, written
    with the store's own client library; those the store keeps as written (Azure makes a backslash a slash and
    refuses '..'), and the keys of the real entries."""
    from jaxcache.storage import open_storage
    from store_servers import put_dir, raw_names, raw_put

    put_dir(store_root, jax_caches["zlib"].root)
    data = open_storage(store_root).read(f"{jax_caches['zlib'].entries[0]['key']}-cache")
    bad = [key_of("jit_a\\b", "1") + "-cache", ".jaxcache/runs/2026-01-01/a\\b-p0.json",
           ".jaxcache/runs/2026-01-01//r-p0.json", ".jaxcache/runs/2026-01-01/../r-p1.json"]
    for name in bad:
        with contextlib.suppress(Exception):  # a store that refuses the name: nothing of it to skip
            raw_put(store_root, name, data if name.endswith("-cache") else b"{}")
    bidi = key_of(BIDI_MODULE, "2")
    raw_put(store_root, f"{bidi}-cache", data)
    keys = sorted([*(e["key"] for e in jax_caches["zlib"].entries), bidi])
    kept = raw_names(store_root)
    return store_root, keys, [name for name in bad if name in kept]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_names_that_cannot_be_read_in_an_object_store_are_skipped_not_fatal(capsys, hostile_bucket):
    url, keys, bad = hostile_bucket
    entries = [name for name in bad if name.endswith("-cache")]  # the rest are run records' names
    assert bad, "the store kept none of the names no backend may read"
    code, out, err = run(capsys, "ls", url, "--json", "--heads")
    assert code == 0, err
    data = json.loads(out)
    assert sorted(e["key"] for e in data["entries"]) == keys and data["skipped"] == len(entries)
    code, out, err = run(capsys, "stats", url, "--json")
    assert code == 0, err
    assert (json.loads(out)["entries"], json.loads(out)["skipped"]) == (len(keys), len(entries))
    code, out, err = run(capsys, "ls", url)
    assert code == 0 and "jit_\\u202eevil\\u202d" in out and "\u202e" not in out

    code, out, err = run(capsys, "doctor", url, "--json")
    d = json.loads(out)
    assert code == (1 if entries else 0) and d["checked"] == len(keys) and d["corrupt"] == [], err
    assert {s["name"] for s in d["skipped"]} == set(entries)

    policy = ("--unused-for", "0s", "--min-age", "0s")
    code, out, err = run(capsys, "prune", url, *policy, "--json")  # reads the run records: the bad ones are skipped
    assert code == 0, err
    plan = json.loads(out)
    assert sorted(d["key"] for d in plan["delete"]) == keys and plan["skipped"] == len(bad)
    code, out, err = run(capsys, "prune", url, *policy, "--apply", "--json")
    assert code == 0, err
    assert json.loads(out)["result"]["deleted"] == len(keys)
    code, out, err = run(capsys, "ls", url, "--json")
    assert code == 0 and json.loads(out)["entries"] == [], err


def _service_survives(client, cache: str, keys: list[str], skipped: set[str]) -> None:
    """Through the service: a rescan answers, every real entry is listed, what it skipped is shown (escaped), the
    unreadable records are counted as malformed, and a normal job's record is folded."""
    import time

    from reports_support import H_ADMIN, H_READ, post, rescan, run, write

    rescan(client, cache)
    (info,) = [c for c in client.get("/v1/caches", headers=H_READ).json()["caches"] if c["name"] == cache]
    assert info["last_scan_error"] is None and info["last_scan_s"] is not None, info
    assert info["last_scan_skipped"] == len(skipped), info
    assert {s["name"] for s in info["last_scan_skipped_names"]} == {shown(name) for name in skipped}
    metrics = client.get("/metrics").text
    assert 'jaxcache_reports_malformed_total{source="storage"}' in metrics  # the unreadable record names
    listed = client.get(f"/v1/caches/{cache}/entries?limit=1000", headers=H_READ).json()["entries"]
    assert sorted(e["key"] for e in listed) == sorted(keys)
    r = post(client, run("after", "a1", [write(keys[0], 1.0, time.time())]), f"?cache={cache}")
    assert r.status_code == 202, r.text
    assert client.get(f"/v1/caches/{cache}/jobs/after", headers=H_READ).json()["processes"] == 1
    again = client.post(f"/v1/caches/{cache}/rescan", headers=H_ADMIN)
    assert again.status_code == 200, again.text


def test_the_service_rescans_a_hostile_root(tmp_path, hostile):
    from fastapi.testclient import TestClient

    from conftest import settled
    from jaxcache.service.app import create_app
    from reports_support import settings

    root, keys = hostile["root"], hostile["entries"]
    bad = root / ".jaxcache" / "runs" / "2026-01-01"
    bad.mkdir(parents=True, exist_ok=True)
    (bad / "a\\b-p0.json").write_bytes(b"{}")
    os.mkfifo(bad / "fifo-p0.json")
    with TestClient(create_app(settings(tmp_path, {"demo": str(root)}))) as client:
        settled(client)
        skipped = {*hostile["skipped"], ".jaxcache/runs/2026-01-01/fifo-p0.json"}
        _service_survives(client, "demo", keys, skipped)


def test_the_service_rescans_a_bucket_with_names_it_cannot_read(tmp_path, hostile_bucket):
    from fastapi.testclient import TestClient

    from conftest import settled
    from jaxcache.service.app import create_app
    from reports_support import settings

    url, keys, bad = hostile_bucket
    with TestClient(create_app(settings(tmp_path, {"prod": url}))) as client:
        settled(client)
        # The records' names: malformed, counted apart.
        _service_survives(client, "prod", keys, {name for name in bad if name.endswith("-cache")})
