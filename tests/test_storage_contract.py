"""One contract every storage backend passes: a local directory, GCS on a real fake-gcs-server, S3 on moto's S3
server and Azure Blob Storage on Azurite (tests/store_servers.py), each through its store's own client library.
What differs between stores is tested beside: tests/test_storage_s3.py, tests/test_storage_azure.py."""

from __future__ import annotations

import uuid

import pytest

from jaxcache.errors import InvalidInputError, InvalidRootError, PathEscapeError, PreconditionFailedError
from jaxcache.storage import LocalStorage, Storage, open_storage, same_stat
from jaxcache.storage.base import stat_of
from store_servers import BUCKETS


@pytest.fixture(params=["local", "gs", "s3", "az"])
def storage(request, tmp_path) -> Storage:
    if request.param == "local":
        return open_storage(str(tmp_path))
    bucket = request.getfixturevalue(BUCKETS[request.param])
    return open_storage(f"{request.param}://{bucket}/team/jax-cache")


def test_write_read_stat(storage):
    storage.write_atomic("a-cache", b"hello world")
    assert storage.read("a-cache") == b"hello world"
    assert storage.read_range("a-cache", 6, 5) == b"world"
    assert storage.read_range("a-cache", 6, 500) == b"world"
    assert storage.read_range("a-cache", 100, 5) == b""
    info = storage.stat("a-cache")
    assert info is not None and info.name == "a-cache" and info.size_bytes == 11 and info.mtime_s > 0
    assert storage.exists("a-cache")


def test_a_read_names_the_object_its_bytes_came_from(storage):
    storage.write_atomic("a-cache", b"first")
    data, info = storage.read_with_info("a-cache")
    listed = {name: (size, mtime, version) for name, size, mtime, version in storage.list_stats()}
    assert data == b"first" and info.name == "a-cache" and info.size_bytes == 5
    # The same object as a listing names it (its version where the store has them, else size and mtime), in one
    # request where the store answers a read with its version.
    assert same_stat(stat_of(info), listed["a-cache"]) and (info.version is None) == (listed["a-cache"][2] is None)
    storage.write_atomic("a-cache", b"second")
    again = storage.read_with_info("a-cache")[1]
    assert not same_stat(stat_of(again), stat_of(info)) and same_stat(stat_of(again), stat_of(storage.stat("a-cache")))
    assert storage.read_with_info("nope") is None


def test_missing_objects_are_return_values(storage):
    assert storage.read("nope") is None
    assert storage.read_range("nope", 0, 10) is None
    assert storage.stat("nope") is None
    assert storage.delete("nope") is False
    assert not storage.exists("nope")


def test_overwrite_and_create_only(storage):
    storage.write_atomic("x", b"one")
    storage.write_atomic("x", b"two")
    assert storage.read("x") == b"two"
    with pytest.raises(PreconditionFailedError):
        storage.write_atomic("x", b"three", create_only=True)
    assert storage.read("x") == b"two"
    storage.write_atomic("y", b"new", create_only=True)
    assert storage.read("y") == b"new"


def test_a_conditional_replace_loses_no_other_writers_update(storage):
    """write_atomic(if_version=...) replaces only the version read earlier: a stale token, or an object deleted since,
    is PreconditionFailedError and leaves the object as it is. On a directory the token is the size and mtime, and a
    replacement of the same size at once is still a new version."""
    name = ".jaxcache/jobs/index.json"
    storage.write_atomic(name, b"one")
    data, info = storage.read_with_info(name)
    first = storage.version_token(info)
    storage.write_atomic(name, b"two", if_version=first)
    assert storage.read(name) == b"two"
    with pytest.raises(PreconditionFailedError):
        storage.write_atomic(name, b"three", if_version=first)
    assert storage.read(name) == b"two"
    second = storage.version_token(storage.read_with_info(name)[1])
    storage.write_atomic(name, b"owt", if_version=second)  # the same size, within the clock's tick
    with pytest.raises(PreconditionFailedError):
        storage.write_atomic(name, b"xxx", if_version=second)
    third = storage.version_token(storage.stat(name))
    assert storage.read(name) == b"owt" and third not in (first, second)
    storage.delete(name)
    with pytest.raises(PreconditionFailedError):
        storage.write_atomic(name, b"back", if_version=third)
    assert storage.read(name) is None
    with pytest.raises(InvalidInputError, match="exclude each other"):
        storage.write_atomic(name, b"x", create_only=True, if_version=third)


def test_conditional_replaces_at_once_count_every_update(storage):
    """Four writers add to one counter by read-modify-write at once, trying again when told another was first: no
    update is lost (on a directory through its lock, on the stores through their preconditions)."""
    import threading

    name = ".jaxcache/jobs/counter"
    storage.write_atomic(name, b"0")
    start, refused = threading.Barrier(4), []

    def add(times: int) -> None:
        start.wait()
        for _ in range(times):
            while True:
                data, info = storage.read_with_info(name)
                try:
                    storage.write_atomic(name, str(int(data) + 1).encode(), if_version=storage.version_token(info))
                    break
                except PreconditionFailedError:
                    refused.append(1)

    threads = [threading.Thread(target=add, args=(5,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert storage.read(name) == b"20"


def test_listing_is_lazy_flat_or_recursive(storage):
    for name in ["b-cache", "a-cache", ".jaxcache/runs/2026-11-30/r1-p0.json", "sub/inner"]:
        storage.write_atomic(name, b"x")
    it = storage.iter_objects()
    assert iter(it) is it  # a generator, not a list
    assert sorted(o.name for o in it) == ["a-cache", "b-cache"]
    assert sorted(o.name for o in storage.iter_objects(recursive=True)) == [
        ".jaxcache/runs/2026-11-30/r1-p0.json", "a-cache", "b-cache", "sub/inner",
    ]
    assert [o.name for o in storage.iter_objects(".jaxcache/runs/", recursive=True)] == [
        ".jaxcache/runs/2026-11-30/r1-p0.json"
    ]
    assert list(storage.iter_objects("missing/")) == []


def test_sorted_listing_claim_holds(storage):
    names = [f"k{i:03d}-cache" for i in range(30)]
    for name in reversed(names):
        storage.write_atomic(name, b"x")
    listed = [o.name for o in storage.iter_objects()]
    if storage.listing_sorted:
        assert listed == sorted(listed)
    assert sorted(listed) == names


def test_delete(storage):
    storage.write_atomic("gone", b"x")
    assert storage.delete("gone") is True
    assert storage.read("gone") is None
    assert storage.delete("gone") is False
    storage.write_atomic("listed", b"x")
    version = storage.stat("listed").version  # None on a directory
    assert storage.delete("listed", if_version=version) is True
    assert storage.read("listed") is None
    # Gone already, as without a version (an applied plan applied again): If-Match fails on a missing object too.
    assert storage.delete("listed", if_version=version) is False


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", "a/../../b", "a//b", "./a", "a\x00b", "a\\..\\b", ""])
def test_names_cannot_escape_the_root(storage, bad):
    for op in (
        lambda: storage.read(bad),
        lambda: storage.read_range(bad, 0, 1),
        lambda: storage.stat(bad),
        lambda: storage.delete(bad),
        lambda: storage.write_atomic(bad, b"x"),
    ):
        with pytest.raises(PathEscapeError):
            op()
    with pytest.raises(PathEscapeError):
        list(storage.iter_objects("../"))


def test_gcs_delete_sends_the_generation_precondition(gcs_bucket):
    # Neither emulator enforces delete preconditions, so check the request itself carries it.
    storage = open_storage(f"gs://{gcs_bucket}/c")
    storage.write_atomic("e-cache", b"v1")
    gen = storage.stat("e-cache").version
    seen: list[str] = []
    session = storage._client._http
    hook = lambda response, *a, **k: seen.append(f"{response.request.method} {response.request.url}")  # noqa: E731
    session.hooks["response"].append(hook)
    try:
        assert storage.delete("e-cache", if_version=gen) is True
    finally:
        session.hooks["response"].remove(hook)
    deletes = [s for s in seen if s.startswith("DELETE ")]
    assert deletes and f"ifGenerationMatch={gen}" in deletes[0]


def test_gcs_versions_are_generations(gcs_bucket, gcs_client):
    """On GCS the version token is the generation, in decimal: a delete's if_version is its ifGenerationMatch."""
    from jaxcache.errors import InvalidInputError
    from jaxcache.storage import generation_of

    storage = open_storage(f"gs://{gcs_bucket}/c")
    storage.write_atomic("e-cache", b"v1")
    info = storage.stat("e-cache")
    blob = gcs_client.bucket(gcs_bucket).get_blob("c/e-cache")
    assert info.version == str(blob.generation) and generation_of(storage.url, info.version) == blob.generation
    assert [o.version for o in storage.iter_objects()] == [info.version]
    assert generation_of("s3://b/c", '"etag"') is None and generation_of("/a/dir", None) is None
    with pytest.raises(InvalidInputError, match="not the generation"):
        storage.delete("e-cache", if_version='"an-etag"')
    assert storage.delete("e-cache", if_version=info.version) is True


def test_gcs_missing_bucket_is_a_clear_error(fake_gcs):
    storage = open_storage(f"gs://no-such-bucket-{uuid.uuid4().hex[:8]}/x")
    with pytest.raises(InvalidRootError, match="does not exist"):
        list(storage.iter_objects())


def test_local_write_leaves_no_temp_files(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.write_atomic(".jaxcache/runs/r.json", b"{}")
    assert sorted(p.name for p in (tmp_path / ".jaxcache" / "runs").iterdir()) == ["r.json"]


def test_local_skips_symlinks(tmp_path):
    (tmp_path / "outside").write_bytes(b"secret")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link-cache").symlink_to(tmp_path / "outside")
    assert list(LocalStorage(root).iter_objects()) == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://bucket/x", "unsupported scheme"),
        ("abfs://container/x", "write az://"),
        ("az://container@account/x", "names the container only"),
        ("az://Container/x", "not a valid container name"),
        ("s3://b/x", "not a valid bucket name"),
        ("s3://bucket/a/./b", "not a clean path"),
        ("gs://Bad_Bucket/x", "not a valid bucket name"),
        ("gs://b/../x", "not a valid bucket name"),
        ("gs://bucket/a/../b", "not a clean path"),
        ("file://host/path", "local path"),
        ("", "empty"),
    ],
)
def test_open_storage_rejects_bad_urls(url, message):
    with pytest.raises(InvalidRootError, match=message):
        open_storage(url)


def test_open_storage_local_forms(tmp_path):
    assert open_storage(str(tmp_path)).url == str(tmp_path)
    assert open_storage(f"file://{tmp_path}").url == str(tmp_path)
    with pytest.raises(InvalidRootError, match="does not exist"):
        open_storage(str(tmp_path / "missing"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(InvalidRootError, match="not a directory"):
        open_storage(str(tmp_path / "f"))


def test_list_changes_against_an_earlier_listing(storage):
    for name in ["a-cache", "a-atime", "b-cache", ".jaxcache/runs/r1-p0.json"]:
        storage.write_atomic(name, b"x")
    everything, gone = storage.list_changes({})
    assert gone == set() and sorted(everything) == ["a-atime", "a-cache", "b-cache"]  # the root's own objects
    assert everything == {o.name: (o.size_bytes, o.mtime_s, o.version) for o in storage.iter_objects()}
    assert dict(storage.iter_listing()) == everything  # the same, one at a time
    assert storage.list_changes(everything) == ({}, set())  # nothing changed: nothing to report
    storage.write_atomic("a-atime", b"longer")  # rewritten
    storage.write_atomic("c-cache", b"x")  # new
    storage.delete("b-cache")  # gone
    changed, gone = storage.list_changes(everything)
    assert sorted(changed) == ["a-atime", "c-cache"] and changed["a-atime"][0] == 6
    assert gone == {"b-cache"}


def test_read_chunks_streams_with_bounded_memory(storage):
    """An entry is hashed chunk by chunk: a 24 MiB object never sits in memory whole."""
    import hashlib
    import os
    import tracemalloc

    data = os.urandom(24 << 20)
    storage.write_atomic("big-cache", data)
    expected = hashlib.sha256(data).hexdigest()
    del data
    assert storage.read_chunks("nope") is None
    tracemalloc.start()
    try:
        chunks = storage.read_chunks("big-cache", chunk_bytes=1 << 20)
        assert chunks is not None
        digest, sizes = hashlib.sha256(), []
        for chunk in chunks:
            digest.update(chunk)
            sizes.append(len(chunk))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest.hexdigest() == expected
    assert max(sizes) <= 1 << 20 and sum(sizes) == 24 << 20
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB while streaming a 24 MiB object"


def test_an_unmounted_volume_is_not_an_empty_root(tmp_path):
    """Unmounted, a volume leaves its empty mount point behind: listed, it would look like an empty cache."""
    import subprocess

    from conftest import tmpfs
    from jaxcache.errors import RootGoneError

    with tmpfs(tmp_path / "nfs") as mount:
        storage = LocalStorage(mount)
        storage.write_atomic("k-cache", b"x")
        assert [o.name for o in storage.iter_objects()] == ["k-cache"]
        subprocess.run(["umount", str(mount)], check=True)
        assert mount.is_dir() and not list(mount.iterdir())
        for listing in (lambda: list(storage.iter_objects()), lambda: storage.list_changes({}), storage.ping,
                        lambda: storage.delete("k-cache"), lambda: storage.read("k-cache")):
            with pytest.raises(RootGoneError, match="was a mount point and is not any more"):
                listing()


def test_a_cache_jax_wrote_reads_the_same_on_every_store(storage, jax_caches):
    """A real cache (entries compiled by JAX, their -atime files) put under the root scans to what JAX wrote."""
    from pathlib import Path

    from jaxcache import entry as fmt
    from jaxcache.scan import Entry, scan

    written = jax_caches["zstd"]
    for path in sorted(Path(written.root).iterdir()):
        if path.is_file():
            storage.write_atomic(path.name, path.read_bytes())
    entries = {r.key: r for r in scan(storage) if isinstance(r, Entry)}
    assert {e["key"]: e["size_bytes"] for e in written.entries} == {k: e.size_bytes for k, e in entries.items()}
    assert all(e.status is fmt.Status.OK and e.compression == "zstd" and e.atime_ns for e in entries.values())


@pytest.mark.parametrize("scheme", ["gs", "s3", "az"])
def test_io_workers_threads_at_once_keep_their_connections(request, scheme, caplog):
    """As many reads at once as the backend asks for (scans run that many): no connection is thrown away for want
    of room in a pool (urllib3 warns of each)."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    storage = open_storage(f"{scheme}://{request.getfixturevalue(BUCKETS[scheme])}/team/jax-cache")

    names = [f"k{i:02d}-cache" for i in range(3 * storage.io_workers)]
    for name in names:
        storage.write_atomic(name, name.encode())
    caplog.set_level(logging.WARNING)
    with ThreadPoolExecutor(storage.io_workers) as pool:
        assert list(pool.map(storage.read, names)) == [name.encode() for name in names]
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


@pytest.fixture(params=["gs", "s3", "az"])
def object_storage(request) -> Storage:
    """A root in each object store, on its server."""
    bucket = request.getfixturevalue(BUCKETS[request.param])
    return open_storage(f"{request.param}://{bucket}/team/jax-cache")


def test_versions_change_with_the_content_and_a_listing_agrees_with_a_stat(object_storage):
    """Each store's version token (GCS's generation, the ETag on S3 and Azure) reads the same from a listing and
    from a stat (quoted or bare ETags, milliseconds or seconds), and a rewrite changes it."""
    from jaxcache.storage import same_object

    object_storage.write_atomic("e-cache", b"v1")
    first = object_storage.stat("e-cache")
    [listed] = object_storage.iter_objects()
    assert first.version and same_object(first, listed)
    object_storage.write_atomic("e-cache", b"v2")
    second = object_storage.stat("e-cache")
    assert second.version != first.version and not same_object(first, second)


def test_create_only_against_a_concurrent_create(object_storage):
    """Eight writers create one object at once: one wins, the others are told, and the object is the winner's."""
    import threading

    start, won, refused = threading.Barrier(8), [], []

    def create(i: int) -> None:
        data = f"writer {i}".encode()
        start.wait()
        try:
            object_storage.write_atomic("k-cache", data, create_only=True)
            won.append(data)
        except PreconditionFailedError:
            refused.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 7
    assert object_storage.read("k-cache") == won[0]


def test_a_read_stream_fails_cleanly_when_the_object_is_replaced(object_storage):
    """Every range comes from the version read first: a replacement midway is an error, never a splice."""
    import os

    from jaxcache.errors import StorageError

    object_storage.write_atomic("big-cache", os.urandom(3 << 20))
    chunks = object_storage.read_chunks("big-cache", chunk_bytes=1 << 20)
    assert next(chunks)
    object_storage.write_atomic("big-cache", os.urandom(3 << 20))
    with pytest.raises(StorageError, match="replaced while it was read"):
        next(chunks)


def test_the_same_object_rule():
    """One rule for 'is this the same object' (the head index, the service's rescans, the tier's copies, retention):
    the same version and size where the store has versions, whatever the mtime (GCS's moves with a metadata change);
    else the same size and mtime."""
    from jaxcache.storage import ObjectInfo, same_object, same_stat

    assert same_object(ObjectInfo("k-cache", 10, 5.0, "7"), ObjectInfo("k-cache", 10, 9.0, "7"))
    assert not same_object(ObjectInfo("k-cache", 10, 5.0, "7"), ObjectInfo("k-cache", 10, 5.0))
    assert not same_stat((10, 5.0, None), (10, 5.0, "7")) and same_stat((10, 5.0, '"e"'), (10, 6.0, '"e"'))
    assert same_object(ObjectInfo("k-cache", 10, 5.0), ObjectInfo("k-cache", 10, 5.0))  # a directory's
    assert not same_object(ObjectInfo("k-cache", 10, 5.0, version='"a"'), ObjectInfo("k-cache", 10, 5.0, version='"b"'))
    assert not same_object(ObjectInfo("k-cache", 10, 5.0), ObjectInfo("k-cache", 10, 6.0))
    assert not same_object(ObjectInfo("k-cache", 10, 5.0), ObjectInfo("k-cache", 11, 5.0))
