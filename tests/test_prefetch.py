"""Prefetch of a job's working set into the node-local tier (#36), for real: JAX jobs on CPU, a gs:// root on
fake-gcs-server behind the fault proxy (tests/gcs_faults.py), which also logs every request. Node A's job leaves
run records; node B, empty, fetches that job's programs while it starts up, before JAX asks for them."""

from __future__ import annotations

import shutil
import time
from urllib.parse import urlencode

import pytest

from jaxcache.client import options as client_options
from jaxcache.errors import InvalidInputError
from jaxcache.storage import gcs as gcs_backend
from test_client_service import REPORT, api, service  # noqa: F401 - a fixture
from test_local_tier import PROGRAMS, entries, faults, final_record, run_job, run_together  # noqa: F401 - a fixture

pytestmark = [pytest.mark.gcs, pytest.mark.slow]


def entry_downloads(log: list[tuple[str, str, int | str]]) -> list[str]:
    """The object names of the entry downloads (media GETs of ``-cache`` objects) in the proxy's log."""
    return [path.split("/o/")[1].split("?")[0] for method, path, _ in log
            if method == "GET" and "alt=media" in path and "-cache" in path]


def test_an_empty_node_has_the_jobs_programs_before_jax_asks(tmp_path, faults, gcs_client, gcs_bucket):  # noqa: F811
    root = f"gs://{gcs_bucket}/jc"
    a, _ = run_job(root, tmp_path / "node-a", "train", settle=False)
    assert a["stats"]["writes"] == len(PROGRAMS), a["stats"]
    written = entries(tmp_path / "node-a" / "unchecked")

    faults.log.clear()
    b, _ = run_job(root, tmp_path / "node-b", "train", "--startup-s", "3")
    local = b["local"]
    assert b["stats"]["hits"] == len(PROGRAMS) and b["stats"]["misses"] == 0, b["stats"]
    # All fetched during the job's start-up; JAX then read each from the node's disk, none on demand.
    assert local["prefetch_wanted"] == local["prefetched"] == len(PROGRAMS), local
    assert local["fetched"] == 0 and local["loaded"] == len(PROGRAMS) and local["prefetch_unused"] == 0, local
    assert local["prefetched_bytes"] == sum(len(v) for v in written.values())
    assert local["prefetched_s"] > 0 and local["prefetch_waited"] == 0, local  # JAX never waited for it
    assert entries(tmp_path / "node-b" / "unchecked") == written
    assert sorted(entry_downloads(faults.log)) == sorted(f"jc%2F{k}" for k in written), faults.log
    assert "4 prefetched of a working set of 4 (0 unused)" in b["summary"], b["summary"]
    # The run record's entry sizes come from the node's copies: no request per program to the root for them.
    assert not [p for m, p, _ in faults.log if m == "GET" and "-cache" in p and "alt=media" not in p], faults.log
    assert final_record(gcs_client, gcs_bucket, b)["local"]["prefetched"] == len(PROGRAMS)


def test_lookups_racing_the_prefetch_never_download_an_entry_twice(tmp_path, faults, gcs_client, gcs_bucket):  # noqa: F811
    """No start-up time: JAX asks while the set is still being found or fetched. A key under way is waited for,
    one not started is fetched by the lookup and never again by the prefetch."""
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "node-a", "train", settle=False)
    written = entries(tmp_path / "node-a" / "unchecked")
    faults.log.clear()
    b, _ = run_job(root, tmp_path / "node-b", "train")
    local = b["local"]
    assert b["stats"]["hits"] == len(PROGRAMS) and b["stats"]["misses"] == 0, b["stats"]
    assert local["prefetched"] + local["fetched"] == len(PROGRAMS), local
    assert sorted(entry_downloads(faults.log)) == sorted(f"jc%2F{k}" for k in written), faults.log


def test_a_set_too_wide_is_counted_and_another_job_gets_none(tmp_path, faults, gcs_client, gcs_bucket):  # noqa: F811
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "node-a", "train", settle=False)
    # The job now runs two of its four programs: the other two were fetched for nothing, and say so.
    b, _ = run_job(root, tmp_path / "node-b", "train", "--programs", "affine,gram", "--startup-s", "3")
    assert b["local"]["prefetched"] == len(PROGRAMS) and b["local"]["prefetch_unused"] == 2, b["local"]
    other, _ = run_job(root, tmp_path / "node-c", "eval", "--startup-s", "1")
    assert other["local"]["prefetch_wanted"] == other["local"]["prefetched"] == 0, other["local"]
    assert other["local"]["fetched"] == len(PROGRAMS), other["local"]


def test_a_root_answering_503_for_a_while_still_starts_the_job(tmp_path, faults, gcs_client, gcs_bucket,  # noqa: F811
                                                               monkeypatch):
    """The prefetches fail: the lookups fetch on demand (or JAX compiles), the job runs, the root keeps its
    entries as they were."""
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "node-a", "train", settle=False)
    written = entries(tmp_path / "node-a" / "unchecked")
    # Each download gives up after 1 s of retries (the library's default is 120 s): the 503s outlast the prefetch.
    monkeypatch.setenv(gcs_backend.RETRY_DEADLINE_ENV, "1")
    faults.fail(40, 503, method="GET", path=r"-cache.*alt=media")
    b, _ = run_job(root, tmp_path / "node-b", "train", "--startup-s", "2")
    assert b["stats"]["hits"] + b["stats"]["misses"] == len(PROGRAMS), b["stats"]
    assert b["local"]["prefetched"] < len(PROGRAMS) and faults.injected(), (b["local"], faults.log)
    faults.clear()
    stored = {blob.name.removeprefix("jc/"): blob.download_as_bytes()
              for blob in gcs_client.list_blobs(gcs_bucket, prefix="jc/") if blob.name.endswith("-cache")}
    assert stored == written


def test_a_job_that_reports_to_the_service_gets_its_set_from_it(service, tmp_path):  # noqa: F811
    """One request to the service, with the job's report token; the root's records are not needed (removed here
    once the service has folded them)."""
    base, cache = service  # a local root: the tier and its prefetch work the same over any root
    reporting = ("--service-url", base, "--token", REPORT)
    run_job(str(cache), "off", "train", *reporting)
    deadline = time.monotonic() + 60
    while not api(base, "/v1/working-set?" + urlencode({"cache_dir": str(cache), "job": "train"}), REPORT)["keys"]:
        assert time.monotonic() < deadline, "the service never folded the writer's record"
        time.sleep(0.5)
    shutil.rmtree(cache / ".jaxcache" / "runs")
    node, _ = run_job(str(cache), tmp_path / "node", "train", *reporting, "--startup-s", "3")
    local = node["local"]
    assert local["prefetch_wanted"] == local["prefetched"] == len(PROGRAMS) and local["fetched"] == 0, local
    assert node["stats"]["hits"] == len(PROGRAMS), node["stats"]


def test_processes_starting_together_on_a_node_download_each_entry_once(tmp_path, faults, gcs_client,  # noqa: F811
                                                                         gcs_bucket):
    """One process per accelerator, all prefetching the same set into the node's directory: they take turns per
    key, so the node downloads each entry once, and every process hits."""
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "node-a", "train", settle=False)
    written = entries(tmp_path / "node-a" / "unchecked")
    faults.log.clear()
    faults.delay_s = 0.1  # a remote root: downloads overlap, and without turns each process would make its own
    node = tmp_path / "node"
    outs = run_together(root, node, [("--job", "train", "--startup-s", "2")] * 3)
    assert all(o["stats"]["hits"] == len(PROGRAMS) for o in outs), [o["stats"] for o in outs]
    assert sorted(entry_downloads(faults.log)) == sorted(f"jc%2F{k}" for k in written), faults.log
    assert sum(o["local"]["prefetched"] + o["local"]["fetched"] for o in outs) == len(PROGRAMS), [
        o["local"] for o in outs]
    assert entries(node / "unchecked") == written


def test_a_bad_prefetch_setting_is_one_line_naming_it(tmp_path):
    args = dict(job=None, min_compile_time_secs=None, min_entry_size_bytes=None, xla_caches=None, max_size_bytes=None,
                service_url=None, token=None, trust="strict", default_xla_caches="none", verify=None)
    for bad in ("many", "-1", "65"):
        with pytest.raises(InvalidInputError, match="JAXCACHE_PREFETCH"):
            client_options.resolve(str(tmp_path), env={"JAXCACHE_PREFETCH": bad}, **args)
    assert client_options.resolve(str(tmp_path), env={"JAXCACHE_PREFETCH": "off"}, **args).prefetch == 0
    assert client_options.resolve(str(tmp_path), env={}, **args).prefetch == client_options.DEFAULT_PREFETCH
