"""GCS answering 429/503 for a while, or losing a response, through a fault-injecting proxy in front of
fake-gcs-server (tests/gcs_faults.py): scans, prunes, create-only writes and jobs retry and finish, and storage
ends exactly as it would have without the faults."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import upload_dir
from gcs_faults import GcsFaults
from jaxcache import entry as fmt
from jaxcache import records
from jaxcache.cli import main
from jaxcache.errors import PreconditionFailedError, StorageError
from jaxcache.prune import Candidate, PrunePolicy, apply, plan
from jaxcache.scan import Entry, scan
from jaxcache.storage import gcs as gcs_backend
from jaxcache.storage import open_storage

pytestmark = [pytest.mark.gcs, pytest.mark.slow]

JOB = Path(__file__).parent / "programs" / "client_job.py"
# What requests' paths look like. Not every request: google-cloud-storage also fetches bucket metadata in the
# background, best effort, which a fault there would not test.
LISTING = r"/o\?"
MEDIA = r"alt=media"
CREATE_ONLY = r"ifGenerationMatch=0"  # google-cloud-storage's uploads with if_generation_match=0


@pytest.fixture
def faults(fake_gcs, monkeypatch) -> Iterator[GcsFaults]:
    """The proxy, with google-cloud-storage clients created from now on going through it.

    The session's ``gcs_client`` still talks to the emulator directly: tests set up and check storage with it."""
    proxy = GcsFaults(fake_gcs)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    # The library's own retry policy, backing off from 20 ms instead of 1 s, keeps each test short.
    monkeypatch.setenv(gcs_backend.RETRY_DELAY_ENV, "0.02")
    try:
        yield proxy
    finally:
        proxy.close()


def _listing(client, bucket: str, prefix: str) -> dict[str, bytes]:
    base = prefix + "/"
    return {b.name[len(base):]: b.download_as_bytes() for b in client.list_blobs(bucket, prefix=base)}


def _entries(url: str) -> dict[str, Entry]:
    return {r.key: r for r in scan(open_storage(url)) if isinstance(r, Entry)}


def test_scan_finishes_through_503_and_429(faults, gcs_client, gcs_bucket, jax_caches):
    upload_dir(gcs_client, gcs_bucket, "jc", jax_caches["zstd"].root)
    url = f"gs://{gcs_bucket}/jc"
    clean = _entries(url)
    assert set(clean) == {e["key"] for e in jax_caches["zstd"].entries}
    assert all(e.status is fmt.Status.OK for e in clean.values())

    faults.fail(2, 503, path=LISTING)
    faults.fail(2, 429, path=LISTING)
    faults.fail(3, 503, path=MEDIA)  # entries' heads and -atime files, read by 16 threads at once
    assert _entries(url) == clean
    assert faults.pending() == 0 and len(faults.injected()) == 7


def test_cli_ls_and_stats_finish_through_503_and_429(faults, capsys, gcs_client, gcs_bucket, jax_caches):
    upload_dir(gcs_client, gcs_bucket, "jc", jax_caches["zlib"].root)
    url = f"gs://{gcs_bucket}/jc"
    manifest = jax_caches["zlib"].entries
    clean = {}
    for command in ("ls", "stats"):
        assert main([command, url, "--json"]) == 0
        clean[command] = json.loads(capsys.readouterr().out)
        faults.fail(1, 503, path=LISTING)
        faults.fail(2, 429, path=LISTING)
        faults.fail(2, 503, path=MEDIA)
        # Without the head index, which would answer from the first call and read no object (no media request).
        code = main([command, url, "--json", "--no-index"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert json.loads(out) == clean[command] and faults.pending() == 0
    assert {e["key"] for e in clean["ls"]["entries"]} == {e["key"] for e in manifest}
    assert clean["stats"]["entries"] == len(manifest)
    assert len(faults.injected()) == 10


def test_prune_deletes_exactly_the_plan_through_503(faults, gcs_client, gcs_bucket, cache_copy):
    upload_dir(gcs_client, gcs_bucket, "jc", cache_copy)
    before = _listing(gcs_client, gcs_bucket, "jc")
    storage = open_storage(f"gs://{gcs_bucket}/jc")
    cands = [Candidate.from_record(r) for r in scan(storage)]
    p = plan(cands, PrunePolicy(functions=("jit_tiny", "jit_odd*"), min_age_s=0), now=time.time())
    doomed = [d.candidate for d in p.delete]
    assert len(doomed) >= 2

    faults.fail(4, 503, method="DELETE")
    faults.fail(2, 429, method="DELETE")
    result = apply(storage, p)
    assert (result.deleted, result.already_gone, result.changed, result.errors) == (len(doomed), 0, 0, [])
    assert faults.pending() == 0
    gone = {f"{c.key}-cache" for c in doomed} | {f"{c.key}-atime" for c in doomed if c.has_atime}
    assert gone <= set(before)
    assert _listing(gcs_client, gcs_bucket, "jc") == {k: v for k, v in before.items() if k not in gone}


def test_create_only_write_whose_response_was_lost_succeeds(faults, gcs_client, gcs_bucket):
    storage = open_storage(f"gs://{gcs_bucket}/jc")
    name, data = ".jaxcache/runs/2025-01-01/run-p0.json", b'{"job": "lost-response"}'
    faults.drop(1, method="POST", path=CREATE_ONLY)
    # The emulator created the object, the client never heard so and retried: the retry got 412.
    storage.write_atomic(name, data, create_only=True)
    assert [what for method, _, what in faults.log if method == "POST"] == ["dropped", 412]
    assert gcs_client.bucket(gcs_bucket).blob(f"jc/{name}").download_as_bytes() == data

    # Someone else's object under the name is still refused, with or without a lost response.
    with pytest.raises(PreconditionFailedError):
        storage.write_atomic(name, b'{"job": "another"}', create_only=True)
    faults.drop(1, method="POST")
    with pytest.raises(PreconditionFailedError):
        storage.write_atomic(name, b'{"job": "another"}', create_only=True)
    assert faults.pending() == 0
    assert gcs_client.bucket(gcs_bucket).blob(f"jc/{name}").download_as_bytes() == data


def test_client_job_exits_0_and_writes_its_record_while_gcs_answers_503(faults, gcs_client, gcs_bucket):
    """Through the proxy go JAX's own reads and writes (gcsfs, with its own retries) and jaxcache's (the entries'
    read-back digests and the run record, google-cloud-storage at its real back-off)."""
    url = f"gs://{gcs_bucket}/jax-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_COMPILATION_CACHE"))}
    env["JAX_PLATFORMS"] = "cpu"
    env["JAXCACHE_LOCAL_DIR"] = "off"  # JAX reads the bucket itself (test_local_tier: through the node-local tier)
    faults.fail(2, 503, method="GET", path=r"/storage/v1/b/[^/]+/o")  # JAX's first lookups
    faults.fail(2, 503, method="POST", path=r"uploadType=resumable")  # JAX writing entries
    faults.fail(2, 429, path=MEDIA)  # the client reading entries back for their digests
    faults.drop(1, method="POST", path=CREATE_ONLY)  # the run record
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", url, "--job", "faulty-gcs"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert faults.pending() == 0
    # No warning (the job's exit summary aside): the lost response is not a failed write.
    said = [line for line in proc.stderr.splitlines() if line.startswith("jaxcache:")]
    assert [line for line in said if not line.startswith("jaxcache: job faulty-gcs: ")] == [], proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    stored = _listing(gcs_client, gcs_bucket, "jax-cache")
    record = records.parse(stored[out["record_name"]])
    assert record.job == "faulty-gcs" and record.final and len(record.keys) == out["stats"]["misses"] >= 4
    for usage in record.keys:
        data = stored[f"{usage.key}-cache"]
        assert usage.event == records.WRITE and usage.size_bytes == len(data), usage
        assert usage.sha256 == hashlib.sha256(data).hexdigest(), usage


def test_a_retry_delay_that_is_not_seconds_is_refused(monkeypatch, capsys):
    monkeypatch.setenv(gcs_backend.RETRY_DELAY_ENV, "soon")
    assert main(["ls", "gs://some-bucket/jc"]) == 2
    assert f"{gcs_backend.RETRY_DELAY_ENV}='soon'" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["soon", "0", "-1", "7200"])
def test_a_retry_deadline_that_is_not_seconds_is_refused(monkeypatch, capsys, bad):
    monkeypatch.setenv(gcs_backend.RETRY_DEADLINE_ENV, bad)
    assert main(["ls", "gs://some-bucket/jc"]) == 2
    err = capsys.readouterr().err
    assert f"{gcs_backend.RETRY_DEADLINE_ENV}={bad!r}" in err and len(err.strip().splitlines()) == 1, err


def test_a_read_gives_up_at_the_retry_deadline(faults, monkeypatch, gcs_client, gcs_bucket):
    """A root answering 503 without end: the read fails once the deadline set passes (the library's own is 120 s),
    and reads again once the root answers."""
    gcs_client.bucket(gcs_bucket).blob("dl/jit_f-cache").upload_from_string(b"entry")
    monkeypatch.setenv(gcs_backend.RETRY_DEADLINE_ENV, "1")
    storage = open_storage(f"gs://{gcs_bucket}/dl")
    faults.fail(1 << 30, 503, method="GET", path=MEDIA)
    with pytest.raises(StorageError, match=r"Timeout of 1\.0s exceeded"):
        storage.read("jit_f-cache")
    assert len(faults.injected()) >= 2  # retried before giving up
    faults.clear()
    assert storage.read("jit_f-cache") == b"entry"


def test_the_proxy_delays_requests_without_serialising_them_and_fails_for_a_window(fake_gcs):
    """What bench/start.py relies on: ``delay_s`` on every request, concurrent ones overlapping, and ``fail_for``
    answering 503 until its window closes; :meth:`GcsFaults.requests` counts them by arrival."""
    import urllib.error
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    proxy = GcsFaults(fake_gcs, delay_s=0.3)
    try:
        def get(_: int) -> int:
            try:
                with urllib.request.urlopen(f"{proxy.url}/storage/v1/b", timeout=10) as resp:
                    return resp.status
            except urllib.error.HTTPError as exc:
                return exc.code

        began = time.time()
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(get, range(8))) == [200] * 8
        assert time.time() - began >= 0.3
        # Overlapping, not queued one after another (counted by the proxy, not timed: CI machines stall).
        assert proxy.most_delayed_at_once >= 2
        assert len(proxy.requests(since=began)) == 8 and proxy.requests(until=began) == []
        proxy.delay_s = 0.0  # the window below is the only clock that matters
        proxy.fail_for(2.0)
        assert get(0) == 503 and proxy.pending() == 0
        time.sleep(2.0)
        assert get(0) == 200
        assert [e[2] for e in proxy.log[-2:]] == [503, 200] and len(proxy.injected()) == 1
    finally:
        proxy.close()
