"""What a node's start asks the shared root (#71): requests that follow the job (the copies it holds and uses, its
working set), never the root's size; and copies the root no longer has leaving the node's disk, each checked at most
once a day. Real jobs (tests/programs/client_job.py) on an s3:// root on moto's S3 server, through the fault proxy
(tests/store_faults.py), whose log of every request is what is counted, by kind, as the store would bill it."""

from __future__ import annotations

import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from store_faults import S3Faults
from test_local_tier import PROGRAMS, entries, run_job

pytestmark = pytest.mark.slow


def through(s3_proxy: S3Faults) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": s3_proxy.url}


def kinds(log: list[tuple[str, str, int | str]]) -> Counter[str]:
    """The requests of the proxy's log by kind: ``list`` (a listing page), ``head`` (an object's metadata), ``get`` (an
    object's bytes), ``put``, ``other``; ``list records``, ``head records``, ``get records`` of jaxcache's own
    objects (``.jaxcache/``: run records, working-set indexes)."""
    found: Counter[str] = Counter()
    for method, raw, _status in log:
        split = urlsplit(raw)
        query = parse_qs(split.query, keep_blank_values=True)
        _bucket, _, key = unquote(split.path).lstrip("/").partition("/")
        records = ".jaxcache/" in (key or query.get("prefix", [""])[0])
        if not key:
            kind = "list" if method == "GET" and ("list-type" in query or "prefix" in query) else "other"
        else:
            kind = {"HEAD": "head", "GET": "get", "PUT": "put", "POST": "put"}.get(method, "other")
        found[f"{kind} records" if records and kind in ("list", "head", "get") else kind] += 1
    return found


def add_unrelated(s3_client, bucket: str, first: int, count: int) -> None:
    """``count`` small objects beside the entries (other jobs' entries, as far as a listing can tell)."""
    def put(i: int) -> None:
        s3_client.put_object(Bucket=bucket, Key=f"jc/jit_other{i:05d}-{i:064x}-cache", Body=b"x")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(first, first + count)))


def test_a_warm_start_asks_the_root_the_same_whatever_its_size(tmp_path, s3_proxy, s3_client, s3_bucket):
    root = f"s3://{s3_bucket}/jc"
    node = tmp_path / "node"
    first, _ = run_job(root, node, "train", **through(s3_proxy))  # its tier keeps what it wrote and uploaded
    assert first["local"]["uploaded"] == len(PROGRAMS), first["local"]
    counted = []
    # More objects than one request lists whole (so each copy is checked on its own), then more than one page of
    # S3's listing (1,000 objects): the old start listed every page.
    for first_new, added in ((0, 550), (550, 550)):
        add_unrelated(s3_client, s3_bucket, first_new, added)
        s3_proxy.log.clear()
        warm, _ = run_job(root, node, "train", **through(s3_proxy))
        assert warm["stats"]["hits"] == len(PROGRAMS) and warm["local"]["loaded"] == len(PROGRAMS), warm
        assert warm["local"]["dropped"] == 0 and warm["local"]["fetched"] == 0, warm["local"]
        counted.append(kinds(s3_proxy.log))
    small, large = counted
    assert {k: n for k, n in small.items() if k != "list"} == {k: n for k, n in large.items() if k != "list"}, counted
    # One page, which says the root is not small; the next start remembers that for a day and lists nothing.
    assert small["list"] == 1 and large["list"] == 0, counted
    assert small["head"] == len(PROGRAMS), counted  # each copy JAX asks for, checked once
    # The working set: the job's index, one GET at start (and at exit process 0's update: a stat, a GET, a PUT
    # beside its run record's); no listing of records, none of them read.
    assert small["list records"] == 0 and small["get records"] == 2 and small["head records"] == 1, counted
    assert small["put"] == 2 and small["get"] == 0, counted


def test_copies_no_job_asks_for_leave_the_disk_checked_at_most_once_a_day(tmp_path, s3_proxy, s3_client, s3_bucket):
    root = f"s3://{s3_bucket}/jc"
    node = tmp_path / "node"
    run_job(root, node, "train", **through(s3_proxy))
    add_unrelated(s3_client, s3_bucket, 0, 550)  # not small: no listing checks the copies at once
    local = node / "unchecked"
    copies = {name.split("-")[0]: name for name in entries(local)}
    s3_client.delete_object(Bucket=s3_bucket, Key=f"jc/{copies['jit_gram']}")  # pruned from the root
    # Checked two days ago (an origin's modification time is its copy's last check); affine's and grad's today.
    for program in ("jit_gram", "jit_wave"):
        old = time.time() - 2 * 86400
        os.utime(local / ".jaxcache" / "origin" / copies[program].removesuffix("-cache"), (old, old))

    s3_proxy.log.clear()
    # The job uses affine alone, and fetches nothing ahead: only the background pass looks at the others.
    out, err = run_job(root, node, "train", "--programs", "affine", JAXCACHE_PREFETCH="0", **through(s3_proxy))
    assert out["stats"]["hits"] == 1 and out["local"]["loaded"] == 1, out
    assert out["local"]["dropped"] == 1 and "no longer has" in err, (out["local"], err)
    assert set(entries(local)) == set(copies.values()) - {copies["jit_gram"]}
    assert not (local / ".jaxcache" / "origin" / copies["jit_gram"].removesuffix("-cache")).exists()
    requests = kinds(s3_proxy.log)
    # affine (JAX asked for it) and the two not checked within a day; grad, checked today, is not asked about.
    assert requests["head"] == 3 and requests["list"] == 1, requests
    heads = {name for method, path, _ in s3_proxy.log
             if method == "HEAD" and (name := unquote(urlsplit(path).path).rsplit("/", 1)[1]).endswith("-cache")}
    assert heads == {copies[p] for p in ("jit_affine", "jit_gram", "jit_wave")}, heads
    wave_checked = (local / ".jaxcache" / "origin" / copies["jit_wave"].removesuffix("-cache")).stat().st_mtime
    assert time.time() - wave_checked < 86400  # checked now: not again for a day
