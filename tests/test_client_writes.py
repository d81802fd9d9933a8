"""What a job's record claims it wrote, and what JAX hands XLA, when the cache root cannot take it (issue #32).

Real JAX compiles on the CPU in fresh processes (tests/programs/client_job.py), as in tests/test_client.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import tmpfs
from jaxcache import entry, records, signing
from jaxcache.client import options as client_options
from jaxcache.client.attestation import Attestor
from jaxcache.client.reporting import RecordWriter
from jaxcache.client.telemetry import Recorder
from jaxcache.errors import InvalidInputError
from jaxcache.storage import open_storage
from jaxcache.usage import read_usage
from test_client import clean_env, result, run_job


@pytest.fixture(params=["jax-main", "jax-next"])
def interpreter(request) -> tuple[str, dict[str, str]]:
    """This venv's JAX (the floor, 0.10.2), and the newest JAX importing the same client through PYTHONPATH."""
    if request.param == "jax-main":
        return sys.executable, {}
    return request.getfixturevalue("next_python_with_jaxcache")


def fill(volume: Path, leave: int = 0) -> None:
    """Write zeros to ``volume`` until it takes no more (down to the byte), or until ``leave`` bytes are free."""
    with open(volume / "filler", "wb", buffering=0) as f:
        if leave:
            st = os.statvfs(volume)
            f.write(bytes(st.f_bavail * st.f_frsize - leave))
            return
        for chunk in (1 << 16, 4096, 1):
            while True:
                try:
                    f.write(bytes(chunk))
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break


def writers(record: records.RunRecord, tmp_path: Path) -> dict[str, str]:
    """The keys whose first writer this record makes its process, as a root's records are read for them."""
    root = tmp_path / "records-root"
    path = root / record.name
    path.parent.mkdir(parents=True)
    path.write_bytes(record.to_json())
    return read_usage(open_storage(str(root))).writer_jaxlib


def test_a_full_disk_compiles_and_claims_no_write(tmp_path):
    """JAX says "writing" and leaves zero-byte files on a full disk: none of them is counted or claimed."""
    with tmpfs(tmp_path / "vol", size="1m") as volume:
        cache = volume / "cache"
        cache.mkdir(mode=0o700)
        fill(volume)
        proc = run_job("--cache-dir", str(cache), "--print-record")
        out = result(proc)
        left = {p.name.removesuffix("-cache"): p.stat().st_size for p in cache.glob("*-cache")}

    stats, summary = out["stats"], out["summary"]
    assert stats["misses"] >= 4 and stats["writes"] == 0 and stats["failed_writes"] == stats["misses"], stats
    # The situation, as JAX leaves it: an empty file per program it said it was writing.
    assert left and set(left.values()) == {0}, left
    record = records.parse(json_bytes(out["record"]))
    assert {u.key for u in record.keys} == set(left)
    for usage in record.keys:
        assert usage.event == records.COMPILED and usage.writes == 0 and usage.compiles == 1, usage
        assert usage.reason.startswith("disk full: ") and "empty file (0 bytes)" in usage.reason, usage.reason
        assert "free on the cache's volume" in usage.reason
    assert writers(record, tmp_path) == {}, "the record makes its process the first writer of an empty entry"
    assert f"{stats['misses']} misses (0 written)" in summary, summary
    assert f"of {stats['misses']} misses: {stats['misses']} compiled, not written ({stats['misses']}: disk full: " \
        in summary, summary
    assert "to explain" not in summary, "a failed write is explained, not left to `jaxcache explain`"
    assert proc.stderr.count("did not leave a whole entry") == 1, proc.stderr


def test_an_entry_torn_after_its_head_is_not_claimed(tmp_path):
    """A disk that fills up in the middle of a big entry leaves its head whole and its tail missing: read back
    whole (as the client does to attest what it wrote), it is no write either."""
    with tmpfs(tmp_path / "vol", size="2m") as volume:
        cache = volume / "cache"
        cache.mkdir(mode=0o700)
        fill(volume, leave=320 * 1024)
        proc = run_job("--cache-dir", str(cache), "--programs", "big", "--print-record", "--settle")
        out = result(proc)
        (torn,) = cache.glob("jit_big-*-cache")
        data = torn.read_bytes()
        checked = subprocess.run([sys.executable, "-m", "jaxcache", "doctor", str(cache), "--verify", "--min-age",
                                  "0s", "--json"], capture_output=True, text=True, timeout=120, env=clean_env())

    assert entry.read_header_bytes(data).status is entry.Status.OK, "the head is there and decodes"
    assert entry.validate(data).status is entry.Status.CORRUPT, "the tail is not"
    stats = out["stats"]
    assert stats["writes"] == 0 and stats["failed_writes"] == 1, stats
    record = records.parse(json_bytes(out["record"]))
    (usage,) = [u for u in record.keys if u.key == torn.name.removesuffix("-cache")]
    assert usage.event == records.COMPILED and usage.writes == 0 and usage.sha256 is None, usage
    assert usage.reason.startswith("disk full: ") and "truncated" in usage.reason, usage.reason
    # The client read it back with the check `doctor --verify` makes (one stream, hashed as it is validated): both
    # find the same damage.
    (verdict,) = [v for v in json.loads(checked.stdout)["entries"] if v["name"] == torn.name]
    assert verdict["class"] == "corrupt" and verdict["sha256"] == hashlib.sha256(data).hexdigest(), verdict
    assert f"broken entry ({verdict['reasons'][0]})" in usage.reason, (verdict, usage.reason)
    assert writers(record, tmp_path) == {}
    assert "1 compiled, not written (1: disk full: " in out["summary"], out["summary"]
    assert proc.stderr.count("did not leave a whole entry") == 1, proc.stderr


@pytest.mark.parametrize("age_s", [3600, 0], ids=["an-hour-ago", "a-moment-ago"])
def test_a_jammed_entry_is_not_claimed_by_the_next_run_either(tmp_path, age_s):
    """Zero-byte entries left by an earlier full disk: JAX cannot load them, says "writing" again and writes
    nothing (the file exists). The next run, with room to spare, claims none of them and says why, however
    recently they were left (no clock slack decides it)."""
    cache = tmp_path / "cache"
    with tmpfs(tmp_path / "vol", size="1m") as volume:
        (volume / "cache").mkdir(mode=0o700)
        fill(volume)
        run_job("--cache-dir", str(volume / "cache"), "--programs", "affine,gram")
        cache.mkdir(mode=0o700)
        for jammed in (volume / "cache").glob("*-cache"):
            (cache / jammed.name).write_bytes(b"")
            os.utime(cache / jammed.name, (time.time() - age_s,) * 2)
    assert len(list(cache.glob("*-cache"))) == 2

    out = result(run_job("--cache-dir", str(cache), "--print-record"))
    stats = out["stats"]
    assert stats["misses"] == 4 and stats["writes"] == 2 and stats["failed_writes"] == 2, stats
    record = records.parse(json_bytes(out["record"]))
    jammed = {p.name.removesuffix("-cache") for p in cache.glob("*-cache") if p.stat().st_size == 0}
    assert len(jammed) == 2
    for usage in record.keys:
        if usage.key in jammed:
            assert usage.event == records.COMPILED and usage.writes == 0, usage
            assert "could not load" in usage.reason, usage.reason
        else:
            assert usage.event == records.WRITE and usage.writes == 1, usage
    assert set(writers(record, tmp_path)) == {u.key for u in record.keys} - jammed
    assert "2 unreadable" in out["summary"], out["summary"]
    # The advice removes exactly those entries, as `jaxcache explain` does (test_explain_jax.py).
    assert all(f"{cache / key}-cache" in out["summary"] for key in jammed), out["summary"]


def test_a_gcs_root_hands_xla_no_path_on_either_jax(tmp_path, gcs_bucket, interpreter):
    """JAX >= 0.11 keeps XLA's autotune cache on by default, under the cache root: for gs:// XLA would be handed
    gs://bucket/.../xla_gpu_per_fusion_autotune_cache_dir, which it cannot write. Without a node-local tier the
    client turns it off."""
    python, extra = interpreter
    url = f"gs://{gcs_bucket}/jax-cache"
    # cwd: a JAX without etils (the second venv has no gcs extras) treats gs://... as a relative local path.
    proc = run_job("--cache-dir", url, "--watch-xla-caches", "--programs", "affine", "--local-dir", "off",
                   python=python, env=clean_env(**extra), cwd=tmp_path)
    out = result(proc)
    assert out["xla_caches"] == "none" and out["fingerprint"]["xla_caches"] == "none", out
    assert out["xla_cache_paths"] == [], "JAX told XLA to keep a sub-cache under the bucket"
    notices = [line for line in proc.stderr.splitlines() if "XLA's own sub-caches" in line]
    assert len(notices) == 1 and url in notices[0] and notices[0].startswith("INFO"), proc.stderr


def test_with_a_local_tier_xla_keeps_its_autotune_cache_on_the_node_from_jax_0_11(tmp_path, gcs_bucket, interpreter):
    """A node-local tier gives XLA's sub-caches a local path (its own, per node): jax >= 0.11 keeps its default
    there, as for a local root; before, where the path enters keys, they stay off."""
    python, extra = interpreter
    local = tmp_path / "node"
    proc = run_job("--cache-dir", f"gs://{gcs_bucket}/jax-cache", "--watch-xla-caches", "--programs", "affine",
                   "--local-dir", str(local), python=python, env=clean_env(**extra), cwd=tmp_path)
    out = result(proc)
    assert out["local_dir"] == str(local / "unchecked"), out
    assert "XLA's own sub-caches" not in proc.stderr
    if tuple(int(p) for p in out["fingerprint"]["jax"].split(".")[:2]) < (0, 11):
        assert out["xla_caches"] == "none" and out["xla_cache_paths"] == []
    else:
        assert out["xla_cache_paths"] and all(out["local_dir"] in said for said in out["xla_cache_paths"]), out


def test_a_local_root_keeps_jax_defaults_for_xla_caches(tmp_path, interpreter):
    """The other side of the gs:// rule: local roots keep what they had (none on the floor, JAX's default after)."""
    python, extra = interpreter
    out = result(run_job("--cache-dir", str(tmp_path / "c"), "--watch-xla-caches", "--programs", "affine",
                         python=python, env=clean_env(**extra)))
    if tuple(int(p) for p in out["fingerprint"]["jax"].split(".")[:2]) < (0, 11):
        assert out["xla_caches"] == "none" and out["xla_cache_paths"] == []
    else:
        assert any(str(tmp_path / "c") in said for said in out["xla_cache_paths"]), out["xla_cache_paths"]


def test_asking_for_xla_sub_caches_on_a_gcs_root_is_refused():
    args = dict(job=None, min_compile_time_secs=None, min_entry_size_bytes=None, max_size_bytes=None,
                service_url=None, token=None, trust="strict", env={})
    off = {**args, "env": {"JAXCACHE_LOCAL_DIR": "off"}}
    for asked in ("all", "xla_gpu_per_fusion_autotune_cache_dir"):
        with pytest.raises(InvalidInputError, match="XLA cannot write"):
            client_options.resolve("gs://bucket/x", xla_caches=asked, default_xla_caches=None, **off)
        # With a node-local tier they go there; should none be writable after all, they are off again.
        tiered = client_options.resolve("gs://bucket/x", xla_caches=asked, default_xla_caches=None, **args)
        assert tiered.jax_settings("/node/dir")["jax_persistent_cache_enable_xla_caches"] == asked
        assert tiered.jax_settings()["jax_persistent_cache_enable_xla_caches"] == "none"
    for default in (None, "none"):
        resolved = client_options.resolve("gs://bucket/x", xla_caches=None, default_xla_caches=default, **args)
        assert resolved.jax_settings()["jax_persistent_cache_enable_xla_caches"] == "none"
    none = client_options.resolve("gs://bucket/x", xla_caches="none", default_xla_caches=None, **args)
    assert none.xla_caches == "none"
    proc = run_job("--cache-dir", "gs://bucket/jax", "--xla-caches", "all", "--local-dir", "off", expect=3)
    assert "InvalidInputError" in proc.stderr and "leave it unset" in proc.stderr


def json_bytes(data: object) -> bytes:
    return json.dumps(data).encode()


def test_the_recorded_digest_is_of_the_bytes_jax_put_on_either_jax(tmp_path, interpreter):
    """The JAX wall's put hook hears the bytes JAX stores: each write's recorded digest and size are the file's."""
    import hashlib

    python, extra = interpreter
    root = tmp_path / "c"
    out = result(run_job("--cache-dir", str(root), "--job", "hashed", python=python, env=clean_env(**extra)))
    record = records.parse((root / out["record_name"]).read_bytes())
    writes = [u for u in record.keys if u.event == records.WRITE]
    assert len(writes) == out["stats"]["writes"] >= 4
    for u in writes:
        data = (root / entry.cache_name(u.key)).read_bytes()
        assert (u.sha256, u.size_bytes) == (hashlib.sha256(data).hexdigest(), len(data)), u.key


def test_an_entry_replaced_between_put_and_read_back_is_never_signed(tmp_path, jax_caches):
    """What is signed is the digest of the bytes JAX handed put; the read-back only confirms the file holds those
    bytes. Bytes planted before the read-back (another program's, whole and valid) get no signature, and the
    write is not claimed."""
    first, other = (Path(jax_caches["zstd"].root) / f"{e['key']}-cache" for e in jax_caches["zstd"].entries[:2])
    key = first.name.removesuffix("-cache")
    writer_key = signing.new_key("writer", str(tmp_path / "writer.key"))
    for planted, signed in ((other.read_bytes(), False), (first.read_bytes(), True)):
        root = tmp_path / f"root-{signed}"
        root.mkdir()
        attestor = Attestor(RecordWriter(str(root)), Recorder(), signing_key=writer_key)
        attestor.on_put(key, first.read_bytes())  # the bytes JAX put
        (root / first.name).write_bytes(planted)  # what the file holds when it is read back
        attestor.submit(key)
        assert attestor.drain(30)
        assert (root / signing.sig_name(key)).exists() is signed
