"""The entry format, pinned against caches JAX really wrote (this JAX, zstd and zlib) and the team fixtures."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import zstandard

from conftest import shared_fixture_dirs
from jaxcache import entry as fmt
from jaxcache.entry import Compression, EntryKind, Status

H = "a" * 64


def _bytes(root: str, name: str) -> bytes:
    return Path(root, name).read_bytes()


@pytest.mark.parametrize(
    ("name", "module", "kind"),
    [
        (f"jit_train_step-{H}-cache", "jit_train_step", EntryKind.CACHE),
        (f"jit_odd-name.v2-{H}-cache", "jit_odd-name.v2", EntryKind.CACHE),
        (f"jit_a-b-c-{H}-atime", "jit_a-b-c", EntryKind.ATIME),
        (f"pmap_f-{H}-cache", "pmap_f", EntryKind.CACHE),
    ],
)
def test_parse_name_splits_from_the_right(name, module, kind):
    parsed = fmt.parse_name(name)
    assert parsed is not None
    assert (parsed.module, parsed.hash, parsed.kind) == (module, H, kind)
    assert parsed.key == f"{module}-{H}"


@pytest.mark.parametrize(
    "name",
    [
        ".lockfile",
        "xla_gpu_per_fusion_autotune_cache_dir",
        f"jit_f-{H}",  # no kind
        f"jit_f-{H}-other",
        f"jit_f-{'A' * 64}-cache",  # upper-case hex is not what JAX writes
        f"jit_f-{'a' * 63}-cache",
        f"jit_f{H}-cache",  # no separator
        f"dir/jit_f-{H}-cache",
        "-cache",
    ],
)
def test_parse_name_rejects_what_jax_did_not_write(name):
    assert fmt.parse_name(name) is None


_ODD = [f"jit_f-{'A' * 64}-cache", f"jit_f-{'a' * 63}-cache", f"jit_f{H}-cache", f"dir/jit_f-{H}-cache", "-cache",
        f"jit_f-{'a' * 63}g-cache", f"jit_f-{'a' * 63}\u00e9-cache", f"jit_f-{'a' * 63}\udcff-cache", f"-{H}0-cache",
        f"jit_f_{H}-cache", f"jit_f-{H}-cache-{'a' * 63}-cache"]


@pytest.mark.parametrize("odd", [None, *_ODD])
def test_names_parse_is_parse_name_over_every_name(odd):
    """The one test of a whole listing's names says what parsing each says."""
    good = [f"jit_train_step-{H}-cache", f"jit_odd-name.v2-{H}-cache", f"-{H}-cache", f"jit_\u00e9-{'0' * 64}-cache",
            f"jit_f-{H}-cache-{'1' * 64}-cache", f"jit_f-{'2' * 64}-atime"]
    names = good if odd is None else [*good[:2], odd, *good[2:]]
    joined = "\0".join(names) + "\0"
    assert fmt.names_parse(joined, len(names)) is all(fmt.parse_name(n) is not None for n in names)
    assert not fmt.names_parse(joined, len(names), ("-cache",))  # an -atime that does not count
    assert fmt.names_parse("", 0) and not fmt.names_parse(f"jit_f-{H}-cache\0x-cache\0", 1)  # a NUL in a name


def test_sniff_compression():
    assert fmt.sniff_compression(zstandard.ZstdCompressor().compress(b"x" * 10)) is Compression.ZSTD
    assert fmt.sniff_compression(zlib.compress(b"x" * 10)) is Compression.ZLIB
    assert fmt.sniff_compression(b"garbage!") is Compression.UNKNOWN
    assert fmt.sniff_compression(b"") is Compression.UNKNOWN


def test_atime_round_trip_and_malformed():
    assert fmt.decode_atime(fmt.encode_atime(1_700_000_000_123_456_789)) == 1_700_000_000_123_456_789
    assert fmt.decode_atime(b"1234567") is None
    assert fmt.decode_atime(b"123456789") is None


# --- contract: what JAX wrote and what JAX's decoder says ---------------------------------------------------


def _check_against_manifest(root: str, manifest: dict) -> None:
    assert manifest["entries"], "the writer logged no writes"
    for e in manifest["entries"]:
        parsed = fmt.parse_name(e["file"])
        assert parsed is not None, e["file"]
        assert parsed.module == e["module"], e["file"]  # the module name JAX logged or recorded
        assert parsed.key == e["key"]
        data = _bytes(root, e["file"])
        assert len(data) == e["size_bytes"]
        header = fmt.read_header_bytes(data)
        assert header.status is Status.OK, header.reason
        assert header.compression.value == e["compression"]
        assert header.compile_seconds == e["stored_compile_seconds"]
        full = fmt.validate(data)
        assert full.status is Status.OK, full.reason
        assert full.compile_seconds == e["stored_compile_seconds"]
        if e.get("has_atime"):
            ns = fmt.decode_atime(_bytes(root, e["key"] + "-atime"))
            assert ns is not None and ns > 1_600_000_000 * 10**9


@pytest.mark.parametrize("compression", ["zstd", "zlib"])
def test_contract_this_jax(jax_caches, compression):
    cache = jax_caches[compression]
    assert cache.manifest["compression"] == compression
    _check_against_manifest(cache.root, cache.manifest)
    # The slow program stores a non-zero whole-second compile time: the 4-byte header is really read.
    assert any(e["stored_compile_seconds"] > 0 for e in cache.entries)
    assert {"jit_odd-name.v2", "jit_tiny", "jit__lambda", "jit_train_step"} <= {e["module"] for e in cache.entries}


@pytest.mark.parametrize("compression", ["zstd", "zlib"])
def test_contract_next_jax(next_jax_caches, compression):
    cache = next_jax_caches[compression]
    print(f"second JAX: {cache.manifest['jax']} on Python {cache.manifest['python']} ({compression})")
    assert cache.manifest["compression"] == compression
    _check_against_manifest(cache.root, cache.manifest)


@pytest.mark.parametrize("fixture_dir", shared_fixture_dirs(), ids=lambda p: p.name)
def test_contract_team_fixtures(fixture_dir):
    manifest = json.loads((fixture_dir / "manifest.json").read_text())
    _check_against_manifest(str(fixture_dir / "cache"), manifest)


def test_team_fixtures_present_or_explained():
    if not shared_fixture_dirs():
        pytest.skip("../shared/fixtures is not beside this checkout: team fixture contract tests skipped")


# --- reading as little as possible ----------------------------------------------------------------------------


def _counting_reader(data: bytes):
    calls: list[tuple[int, int]] = []

    def read(offset: int, length: int) -> bytes:
        calls.append((offset, length))
        return data[offset : offset + length]

    return read, calls


@pytest.mark.parametrize("compression", ["zstd", "zlib"])
def test_header_reads_a_prefix_only(jax_caches, compression):
    cache = jax_caches[compression]
    big = max(cache.entries, key=lambda e: e["size_bytes"])
    data = _bytes(cache.root, big["file"])
    read, calls = _counting_reader(data)
    header = fmt.read_header(read, len(data))
    assert header.compile_seconds == big["stored_compile_seconds"]
    fetched = sum(length for _, length in calls)
    if compression == "zlib":
        assert calls == [(0, 256)]
    else:
        # zstd gives no output before its first block is complete: at most two reads, the second one ending
        # exactly at the end of that block (at most 128 KiB plus headers), never the whole large entry.
        assert len(calls) <= 2
        assert fetched <= 18 + 3 + 128 * 1024
        assert fetched < len(data)


# --- corrupt entries ------------------------------------------------------------------------------------------


def _corruptions(data: bytes, compression: str) -> dict[str, bytes]:
    flipped = bytearray(data)
    if compression == "zlib":
        flipped[len(data) // 2] ^= 0xFF  # adler32 catches any damaged byte
    else:
        # The frame header's descriptor byte: the declared layout no longer matches the data. (A byte flipped
        # deep inside a zstd block can decompress cleanly: zstd frames from JAX carry no checksum.)
        flipped[4] ^= 0xFF
    return {
        "empty": b"",
        "truncated": data[: len(data) // 2],
        "truncated-to-header": data[:3],
        "garbage": bytes(range(7, 200)),
        "flipped": bytes(flipped),
        "trailing": data + b"\x00junk",
    }


@pytest.mark.parametrize("compression", ["zstd", "zlib"])
@pytest.mark.parametrize("damage", ["empty", "truncated", "truncated-to-header", "garbage", "flipped", "trailing"])
def test_corrupt_entries_are_classified_with_a_reason(jax_caches, compression, damage):
    cache = jax_caches[compression]
    big = max(cache.entries, key=lambda e: e["size_bytes"])
    bad = _corruptions(_bytes(cache.root, big["file"]), compression)[damage]
    v = fmt.validate(bad)
    assert v.status is Status.CORRUPT
    assert v.reason and len(v.reason) > 10


def test_header_check_reports_corruption_it_can_see(jax_caches):
    data = _bytes(jax_caches["zlib"].root, jax_caches["zlib"].entries[0]["file"])
    assert fmt.read_header_bytes(b"").status is Status.CORRUPT
    assert "not a zstd or zlib" in fmt.read_header_bytes(b"hello world").reason
    assert fmt.read_header_bytes(data[:1]).status is Status.CORRUPT


def test_validation_counts_the_executable(jax_caches):
    e = jax_caches["zstd"].entries[0]
    data = _bytes(jax_caches["zstd"].root, e["file"])
    v = fmt.validate(data)
    assert v.executable_bytes == len(zstandard.ZstdDecompressor().decompress(data)) - 4


def _stream(data: bytes, chunk: int = 1 << 20):
    return (data[i : i + chunk] for i in range(0, len(data), chunk))


BOMB = (7).to_bytes(fmt.TIME_HEADER_BYTES, "big") + b"\0" * (256 << 20)  # 256 MiB of output from a few KiB on storage
PACKERS = {
    "zstd": lambda raw: zstandard.ZstdCompressor().compress(raw),
    "zstd-unsized": lambda raw: zstandard.ZstdCompressor(write_content_size=False).compress(raw),
    "zlib": lambda raw: zlib.compress(raw, 9),
}


@pytest.mark.parametrize("packer", list(PACKERS))
def test_validation_memory_is_bounded_whatever_the_ratio(packer):
    """A decompression bomb written into the bucket costs the verifier at most a few MiB, not its output."""
    import tracemalloc

    packed = PACKERS[packer](BOMB)
    assert len(packed) < (1 << 20)
    tracemalloc.start()
    try:
        found = fmt.validate_chunks(_stream(packed))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found.status is Status.OK and found.compile_seconds == 7
    assert found.executable_bytes == len(BOMB) - fmt.TIME_HEADER_BYTES
    assert peak < 24 << 20, f"peak {peak / 2**20:.0f} MiB for {len(BOMB) >> 20} MiB of output"


@pytest.mark.parametrize("packer", list(PACKERS))
def test_streamed_validation_finds_truncation_and_trailing_bytes(packer):
    raw = (3).to_bytes(fmt.TIME_HEADER_BYTES, "big") + bytes(range(256)) * 4096
    packed = PACKERS[packer](raw)
    assert fmt.validate_chunks(_stream(packed, 4096)).status is Status.OK
    cut = fmt.validate_chunks(_stream(packed[: len(packed) // 2], 4096))
    assert cut.status is Status.CORRUPT and ("truncated" in cut.reason or "damaged" in cut.reason), cut.reason
    for extra in (b"junk", packed):
        longer = fmt.validate_chunks(_stream(packed + extra, 4096))
        assert longer.status is Status.CORRUPT and longer.reason, (packer, extra[:4], longer)
