"""A decompression bomb never passes for an entry (#49 item 11): what an entry may expand to is bounded
(JAXCACHE_MAX_DECOMPRESSED_BYTES, default 4 GiB) wherever entries are checked whole — `bundle import`,
`doctor --verify` and the node-local tier's admission all use jaxcache.entry's check. Kept (#58): frames that do not
declare their size, zlib streams, and frames or streams one after another (JAX writes one; a second is damage)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zlib

import pytest
import zstandard

from jaxcache import entry
from jaxcache.cli import main
from test_bundles import bundle, members, write_tar, written  # noqa: F401 - fixtures
from test_client_service import _env
from test_local_tier import PROGRAMS
from test_local_tier import run_job as run_node_job

BLOCK = 128 * 1024  # zstd's largest block: one RLE block of 4 bytes stands for it


def zstd_bomb(size: int, *, declared: bool = True) -> bytes:
    """A real zstd frame of ``size`` zero bytes (a multiple of 128 KiB) made of RLE blocks, ~32,768 to 1: what a
    bucket writer can plant without ever holding what it expands to. ``declared``: the frame header says its size,
    as JAX's frames do; else the reader only learns it by decompressing."""
    window = bytes([7 << 3])  # a 128 KiB window
    header = entry.ZSTD_MAGIC + (b"\xc0" + window + size.to_bytes(8, "little") if declared else b"\x00" + window)
    block = lambda last: (last | 1 << 1 | BLOCK << 3).to_bytes(3, "little") + b"\x00"  # noqa: E731 - RLE, byte 0
    return header + block(0) * (size // BLOCK - 1) + block(1)


def test_the_bomb_is_a_real_zstd_frame():
    for declared in (True, False):
        small = zstd_bomb(8 * BLOCK, declared=declared)
        assert zstandard.ZstdDecompressor().decompressobj().decompress(small) == bytes(8 * BLOCK)
        assert entry.validate(small).status is entry.Status.OK  # under the limit: a (pointless) entry


BOMBS = {  # how it is made, the limit set (JAXCACHE_MAX_DECOMPRESSED_BYTES; "": the default), what it is called
    "zstd, 16 GiB declared": (lambda: zstd_bomb(16 << 30), "", "expands to more than 4.0 GiB"),
    "zstd, size undeclared": (lambda: zstd_bomb(64 << 20, declared=False), "16MiB", "expands to more than 16.0 MiB"),
    "zlib": (lambda: zlib.compress(bytes(64 << 20), 9), "16MiB", "expands to more than 16.0 MiB"),
    # Frames one after another, each under the limit (8 MiB, 64 times): JAX writes one frame, so a second is damage.
    "zstd, 64 frames declared": (lambda: zstd_bomb(8 << 20) * 64, "16MiB", "(a second frame)"),
    "zstd, 64 frames undeclared": (lambda: zstd_bomb(8 << 20, declared=False) * 64, "16MiB",
                                   "trailing bytes after the end of the compressed stream"),
    "zlib, 8 streams": (lambda: zlib.compress(bytes(8 << 20), 9) * 8, "16MiB",
                        "trailing bytes after the end of the compressed stream"),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_bomb_in_a_bundle_is_refused_on_import_and_the_rest_imported(bundle, tmp_path, capsys, monkeypatch,  # noqa: F811
                                                                      name):
    make, limit, said = BOMBS[name]
    items = dict(members(bundle))
    manifest = json.loads(items["manifest.json"])
    bomb = make()
    assert len(bomb) < 600_000
    first = manifest["entries"][0]
    first.update(sha256=hashlib.sha256(bomb).hexdigest(), size_bytes=len(bomb), signature=False)
    items[f"{first['key']}-cache"] = bomb
    del items[f"{first['key']}-sig"]
    items["manifest.json"] = json.dumps(manifest).encode()
    path = write_tar(tmp_path / "bomb.tar", list(items.items()))
    if limit:
        monkeypatch.setenv(entry.MAX_DECOMPRESSED_ENV, limit)
    code = main(["bundle", "import", str(path), str(tmp_path / "root"), "--json"])  # no trusted keys: digests only
    answer = json.loads(capsys.readouterr().out)
    assert code == 1 and [r["key"] for r in answer["refused"]] == [first["key"]], answer
    assert answer["refused"][0]["why"].startswith("corrupt: ") and said in answer["refused"][0]["why"], answer
    assert len(answer["imported"]) == len(manifest["entries"]) - 1
    assert not (tmp_path / "root" / f"{first['key']}-cache").exists()


@pytest.mark.parametrize("name", list(BOMBS))
def test_doctor_verify_calls_a_bomb_corrupt_and_judges_the_rest(written, tmp_path, name):  # noqa: F811
    make, limit, said = BOMBS[name]
    root = tmp_path / "root"
    shutil.copytree(written, root)
    victim = sorted(root.glob("*-cache"))[0]
    victim.write_bytes(make())
    os.utime(victim, (time.time() - 7200, time.time() - 7200))  # past the grace period: judged, not pending
    env = _env(**({entry.MAX_DECOMPRESSED_ENV: limit} if limit else {}))
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "doctor", str(root), "--verify", "--json"],
                          capture_output=True, text=True, timeout=120, env=env)
    judged = {e["key"]: e for e in json.loads(proc.stdout)["entries"]}
    key = victim.name.removesuffix("-cache")
    assert proc.returncode == 1 and judged[key]["class"] == "corrupt", proc.stdout
    assert any(said in r for r in judged[key]["reasons"]), judged[key]
    assert sum(e["class"] == "ok" for e in judged.values()) == len(judged) - 1


def test_the_limit_is_settable_and_a_bad_one_is_one_line(written, tmp_path):  # noqa: F811
    root = tmp_path / "root"
    shutil.copytree(written, root)
    for path in root.glob("*-cache"):
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    cli = [sys.executable, "-m", "jaxcache", "doctor", str(root), "--verify", "--json"]
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=120,
                          env=_env(**{entry.MAX_DECOMPRESSED_ENV: "1KiB"}))  # below the real entries here
    assert proc.returncode == 1 and {e["class"] for e in json.loads(proc.stdout)["entries"]} == {"corrupt"}
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=120,
                          env=_env(**{entry.MAX_DECOMPRESSED_ENV: "lots"}))
    assert proc.returncode == 2 and entry.MAX_DECOMPRESSED_ENV in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_a_bomb_is_refused_before_it_is_decompressed_when_its_frame_declares_its_size():
    """Nothing is decompressed for a frame that declares more than the limit: the verdict costs no 16 GiB of work,
    which a stream cut after the header (all a reader is handed) shows."""
    bomb = zstd_bomb(16 << 30)
    found = entry.validate_chunks([bomb[:64]])
    assert found.status is entry.Status.CORRUPT and "expands to more than 4.0 GiB" in (found.reason or "")
    assert entry.validate(zstd_bomb(4 * BLOCK), max_bytes=BLOCK).status is entry.Status.CORRUPT


@pytest.mark.gcs
def test_the_node_local_tier_never_admits_a_bomb(tmp_path, gcs_client, gcs_bucket):
    root = f"gs://{gcs_bucket}/jc"
    run_node_job(root, tmp_path / "node-a", "train")
    (wave,) = [b.name for b in gcs_client.list_blobs(gcs_bucket, prefix="jc/jit_wave-") if b.name.endswith("-cache")]
    gcs_client.bucket(gcs_bucket).blob(wave).upload_from_string(zstd_bomb(256 << 20))  # over the limit set below
    b, err = run_node_job(root, tmp_path / "node-b", "train", **{entry.MAX_DECOMPRESSED_ENV: "64MiB"})
    assert "expands to more than 64.0 MiB" in err and b["local"]["skipped"] == 1, (b["local"], err)
    assert b["stats"]["misses"] == 1 and b["stats"]["hits"] == len(PROGRAMS) - 1, b["stats"]  # wave compiled
