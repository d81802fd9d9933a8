"""Bytes a store's library rewrites (#72 item 1): an object stored with ``Content-Encoding: gzip`` is decoded by
azure-storage-blob and google-cloud-storage unless told not to, so every bound on its size (a record's 32 MiB, a
``-sig``'s 64 KiB, JAXCACHE_MAX_DECOMPRESSED_BYTES) applied only once the whole decoded object was in memory. Every
read of every store now returns the bytes as stored, and an object that carries a Content-Encoding is refused before
its bytes are decoded (``EncodedObjectError``, a kind of ``NotRegularFileError``: every reader skips it) and named
once as not an entry, record or signature jaxcache wrote: by doctor, doctor --verify and the service."""

from __future__ import annotations

import json
import tracemalloc
import zlib

import pytest

from jaxcache import signing, skips
from jaxcache.cli import main
from jaxcache.errors import EncodedObjectError
from jaxcache.records import MAX_RECORD_BYTES
from jaxcache.storage import open_storage
from store_servers import put_dir, raw_put

#: What the gzip bomb decodes to: far above what a bounded read may hold.
DECODED = 128 << 20
RECORD = ".jaxcache/runs/2026-12-01/run-1-p0.json"


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A gzip stream of 128 MiB of zeros in 8 members (a decoder reads them all as one), about 130 KB stored."""
    member = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    one = member.compress(bytes(DECODED // 8)) + member.flush()
    return one * 8


def test_every_read_of_an_encoded_object_is_refused_before_it_is_decoded(store_root, bomb):
    """read, read_range, read_with_info, read_bounded and read_chunks each raise, holding no more than the bytes as
    stored (botocore never decodes, so on S3 the object is named the same way without having grown)."""
    raw_put(store_root, RECORD, bomb, content_encoding="gzip")
    raw_put(store_root, "plain-cache", b"as stored", content_encoding="identity")
    storage = open_storage(store_root)
    reads = {
        "read": lambda: storage.read(RECORD),
        "read_range": lambda: storage.read_range(RECORD, 0, 100),
        "read_with_info": lambda: storage.read_with_info(RECORD),
        "read_bounded": lambda: storage.read_bounded(RECORD, MAX_RECORD_BYTES, listed_bytes=len(bomb)),
        "read_chunks": lambda: list(storage.read_chunks(RECORD) or ()),
    }
    tracemalloc.start()
    try:
        for what, read in reads.items():
            with pytest.raises(EncodedObjectError, match="Content-Encoding 'gzip'"):
                read()
                pytest.fail(f"{what} read it")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"peak {peak / 2**20:.0f} MiB reading a {len(bomb) / 2**10:.0f} KiB object"
    [(name, why)] = storage.skipped.items()
    assert name == RECORD and "not an entry, record or signature jaxcache wrote" in why, why
    assert storage.read("plain-cache") == b"as stored"  # Content-Encoding: identity is the bytes as stored


@pytest.fixture
def planted(store_root, jax_caches, bomb) -> tuple[str, str, str]:
    """A real JAX cache in ``store_root`` beside an entry, a run record and a ``-sig`` stored with Content-Encoding:
    gzip; ``(root, the encoded entry's name, the key beside the encoded -sig)``."""
    put_dir(store_root, jax_caches["zstd"].root)
    keys = sorted(e["key"] for e in jax_caches["zstd"].entries)
    encoded = f"jit_bomb-{'0' * 64}-cache"
    raw_put(store_root, encoded, bomb, content_encoding="gzip")
    raw_put(store_root, RECORD, bomb, content_encoding="gzip")
    raw_put(store_root, signing.sig_name(keys[0]), bomb, content_encoding="gzip")
    return store_root, encoded, keys[0]


def test_doctor_names_an_encoded_object_in_one_line(planted, capsys):
    root, encoded, _ = planted
    assert main(["doctor", root]) == 1
    out, err = capsys.readouterr()
    assert err == "", err
    lines = [line for line in out.splitlines() if encoded in line]
    assert len(lines) == 1 and "Content-Encoding 'gzip'" in lines[0], out
    assert "1 skipped" in out.splitlines()[0] and "stored with a Content-Encoding" in out, out


def test_doctor_verify_judges_the_entry_beside_an_encoded_signature_as_beside_a_malformed_one(planted, capsys,
                                                                                               tmp_path, monkeypatch):
    root, encoded, beside = planted
    key = signing.new_key("writers", str(tmp_path / "writers.key"))
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, key.public_text())
    assert main(["doctor", root, "--verify", "--min-age", "0s", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "", err
    found = json.loads(out)
    judged = {e["key"]: e for e in found["entries"]}
    assert judged[beside]["signature"] == skips.BAD_SIGNATURE, judged[beside]
    assert any("Content-Encoding 'gzip'" in r for r in judged[beside]["reasons"]), judged[beside]
    assert {e["signature"] for k, e in judged.items() if k != beside} == {None}
    skipped = {s["name"]: s["reason"] for s in found["skipped"]}
    assert set(skipped) == {encoded, RECORD, signing.sig_name(beside)}, skipped
    assert all("Content-Encoding 'gzip'" in why for why in skipped.values()), skipped
    assert main(["doctor", root, "--verify", "--min-age", "0s"]) == 0
    text = capsys.readouterr().out
    assert "1 entry with a bad signature beside it" in text and "stored with a Content-Encoding" in text, text


def test_the_service_skips_and_names_encoded_objects(planted, tmp_path, monkeypatch):
    """The first rescan names the encoded entry among what it skipped (GET /v1/caches), never indexing it; the
    integrity pass names the encoded -sig on its entry's row as a bad signature; the encoded record is not ingested."""
    from conftest import settled
    from test_service_integrity import ADMIN, READ, _app, _headers, _rescanned

    root, encoded, beside = planted
    with _app(root, tmp_path) as client:
        settled(client)
        [cache] = client.get("/v1/caches", headers=_headers(READ)).json()["caches"]
        skipped = {s["name"]: s["why"] for s in cache["last_scan_skipped_names"]}
        assert "Content-Encoding 'gzip'" in skipped.get(encoded, ""), cache
        _rescanned(client)
        assert client.get(f"/v1/caches/c/entries/{encoded[:-6]}", headers=_headers(READ)).status_code == 404
        verify = client.post("/v1/caches/c/verify", json={"recheck_all": True}, headers=_headers(ADMIN))
        assert verify.status_code == 200, verify.text
        summary = client.get("/v1/caches/c/integrity", headers=_headers(READ)).json()
        assert summary["bad_signatures"] == 1, summary
        [problem] = [p for p in summary["problems"] if p["signature"]]
        assert problem["key"] == beside and any("Content-Encoding 'gzip'" in r for r in problem["reasons"]), problem



def test_explain_goes_past_an_encoded_entry_of_the_function_it_explains(store_root, bomb, capsys):
    """explain reads the first bytes of a missed function's other entries (their compression): an encoded one is
    passed over (named in what the storage skipped), not the end of the command."""
    import time

    from reports_support import run, write

    now = time.time()
    old, new = f"jit_step-{'1' * 64}", f"jit_step-{'2' * 64}"
    raw_put(store_root, f"{old}-cache", bomb, content_encoding="gzip")
    record = run("train", "r1", [write(new, 3.5, now + 60)], at=now + 60)
    open_storage(store_root).write_atomic(record.name, record.to_json())
    assert main(["explain", store_root, "--json"]) == 0
    [miss] = json.loads(capsys.readouterr().out)["misses"]
    assert miss["key"] == new, miss
