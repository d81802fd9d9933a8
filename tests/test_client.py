"""jaxcache.client against real JAX, in fresh processes (enable_cache() is once per process by design)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxcache import records
from jaxcache.client import options as client_options
from jaxcache.client import trust
from jaxcache.client.errors import CacheNotConfiguredError
from jaxcache.errors import InvalidInputError
from ports import free_port

JOB = Path(__file__).parent / "programs" / "client_job.py"


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any cache settings of its own, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_COMPILATION_CACHE"))}
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def run_job(*args: str, python: str = sys.executable, env: dict[str, str] | None = None, cwd: Path | None = None,
            expect: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([python, str(JOB), *args], capture_output=True, text=True, timeout=300,
                          env=env or clean_env(), cwd=cwd)
    assert proc.returncode == expect, f"exit {proc.returncode}, expected {expect}\n{proc.stdout}\n{proc.stderr}"
    return proc


def result(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def read_record(root: Path, name: str) -> records.RunRecord:
    return records.parse((root / name).read_bytes())


@pytest.fixture(params=["jax-main", "jax-next"])
def interpreter(request) -> tuple[str, dict[str, str]]:
    """This venv's JAX, and the second JAX version (0.12) importing the same client through PYTHONPATH."""
    if request.param == "jax-main":
        return sys.executable, {}
    return request.getfixturevalue("next_python_with_jaxcache")


# --- end to end: writes, hits, records -----------------------------------------------------------------------


def test_first_run_writes_and_second_run_hits_everything(tmp_path, interpreter):
    python, extra = interpreter
    cache = tmp_path / "cache"
    first = result(run_job("--cache-dir", str(cache), "--job", "train-a", python=python, env=clean_env(**extra)))
    s1 = first["stats"]
    assert s1["hits"] == 0 and s1["misses"] >= 4 and s1["writes"] == s1["misses"], s1
    assert s1["compile_s"] > 0

    record = read_record(cache, first["record_name"])
    assert record.job == "train-a" and record.final and record.process_count == 1
    assert record.cache_dir == str(cache.resolve()) and record.topology == "1x1x1"
    assert record.fingerprint.compression == "zstandard" and record.fingerprint.backend == "cpu"
    assert len(record.keys) == s1["misses"]
    for usage in record.keys:
        entry = cache / f"{usage.key}-cache"
        assert usage.event == records.WRITE and usage.writes == 1 and usage.compiles == 1, usage
        assert entry.is_file() and usage.size_bytes == entry.stat().st_size
        assert usage.compile_s is not None and 0 < usage.compile_s < 60
        assert usage.function == usage.key.rsplit("-", 1)[0]
    written = {u.key for u in record.keys}
    assert written == {p.name.removesuffix("-cache") for p in cache.glob("*-cache")}

    second = result(run_job("--cache-dir", str(cache), "--job", "train-a", python=python, env=clean_env(**extra)))
    s2 = second["stats"]
    assert s2["hits"] == s1["misses"] and s2["misses"] == 0 and s2["writes"] == 0 and s2["hit_rate"] == 1.0, s2
    assert s2["retrieval_s"] > 0
    again = read_record(cache, second["record_name"])
    assert again.run_id != record.run_id
    assert {u.key for u in again.keys} == written
    assert all(u.event == records.HIT and u.hits == 1 and u.retrieval_s > 0 for u in again.keys)
    assert "100%" in second["summary"] and "train-a" in second["summary"]
    assert second["fingerprint"]["digest"] == first["fingerprint"]["digest"]


def test_every_spelling_of_one_directory_hits(tmp_path, interpreter):
    """Relative, trailing slash, file://, and a symlinked mount of one directory are one cache."""
    python, extra = interpreter
    cache = tmp_path / "cache"
    (tmp_path / "mnt").symlink_to(cache, target_is_directory=True)
    cache.mkdir()
    first = result(run_job("--cache-dir", str(cache), python=python, env=clean_env(**extra)))
    assert first["stats"]["writes"] >= 4
    for spelling in ("cache", "./cache/", str(cache) + "//", f"file://{cache}", "mnt/"):
        out = result(run_job("--cache-dir", spelling, python=python, env=clean_env(**extra), cwd=tmp_path))
        assert out["cache_dir"] == str(cache.resolve()), spelling
        assert out["stats"]["misses"] == 0 and out["stats"]["hits"] == first["stats"]["writes"], (spelling, out)


def test_directory_from_the_environment_and_the_default_job_name(tmp_path):
    cache = tmp_path / "env-cache"
    out = result(run_job(env=clean_env(JAX_COMPILATION_CACHE_DIR=str(cache))))
    assert out["cache_dir"] == str(cache) and read_record(cache, out["record_name"]).job == "client_job"
    other = tmp_path / "jaxcache-dir"
    out = result(run_job(env=clean_env(JAXCACHE_DIR=str(other), JAX_COMPILATION_CACHE_DIR=str(cache),
                                       JAXCACHE_JOB="from-env", JAXCACHE_RUN_ID="run-42")))
    record = read_record(other, out["record_name"])
    assert out["cache_dir"] == str(other) and record.job == "from-env" and record.run_id == "run-42"
    assert out["record_name"].endswith("/run-42-p0.json")


def test_jax_thresholds_kept_by_default_and_a_skipped_write_says_why(tmp_path):
    cache = tmp_path / "cache"
    out = result(run_job("--cache-dir", str(cache), "--default-thresholds"))
    assert out["stats"]["misses"] >= 4 and out["stats"]["writes"] == 0
    assert not list(cache.glob("*-cache"))
    record = read_record(cache, out["record_name"])
    for usage in record.keys:
        assert usage.event == records.COMPILED and usage.compile_s is not None
        assert "jax_persistent_cache_min_compile_time_secs=1" in usage.reason, usage.reason


def test_xla_caches_default_depends_on_the_jax_version_and_can_be_overridden(tmp_path, interpreter):
    python, extra = interpreter
    out = result(run_job("--cache-dir", str(tmp_path / "a"), python=python, env=clean_env(**extra)))
    version = tuple(int(p) for p in out["fingerprint"]["jax"].split(".")[:2])
    expected = "none" if version < (0, 11) else "xla_gpu_per_fusion_autotune_cache_dir"
    assert out["fingerprint"]["xla_caches"] == expected
    out = result(run_job("--cache-dir", str(tmp_path / "b"), "--xla-caches", "all", python=python,
                         env=clean_env(**extra)))
    assert out["fingerprint"]["xla_caches"] == "all"


def test_max_size_bytes_turns_on_jax_lru_locally(tmp_path):
    cache = tmp_path / "cache"
    run_job("--cache-dir", str(cache), "--max-size-bytes", str(64 * 1024 * 1024))
    assert list(cache.glob("*-atime")) and (cache / ".lockfile").exists()


# --- refusals ----------------------------------------------------------------------------------------------


def test_compiling_before_enable_cache_is_refused_with_what_to_do(tmp_path):
    proc = run_job("--cache-dir", str(tmp_path / "c"), "--compile-first", expect=3)
    assert "CacheAlreadyInitializedError" in proc.stderr and "earlier" in proc.stderr
    assert not (tmp_path / "c").exists()


def test_a_second_call_returns_the_same_session_or_refuses_other_settings(tmp_path):
    run_job("--cache-dir", str(tmp_path / "c"), "--twice", "same")
    proc = run_job("--cache-dir", str(tmp_path / "d"), "--twice", "other", expect=3)
    assert "CacheAlreadyInitializedError" in proc.stderr and "another-job" in proc.stderr


def test_group_writable_directory_is_refused_in_strict_mode_and_allowed_when_told(tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o775)
    proc = run_job("--cache-dir", str(cache), expect=3)
    assert "UntrustedCacheDirError" in proc.stderr and "writable by its group" in proc.stderr
    assert "chmod go-w" in proc.stderr
    assert list(cache.iterdir()) == [], "a refused directory must be left untouched"
    proc = run_job("--cache-dir", str(cache), "--trust", "warn")
    assert "not trustworthy" in proc.stderr and list(cache.glob("*-cache"))
    run_job("--cache-dir", str(cache), "--trust", "off")


def test_max_size_bytes_is_refused_for_gcs_roots_without_a_local_tier():
    """JAX's LRU cannot evict on a bucket; with a node-local tier (the default for gs://) it caps that instead."""
    proc = run_job("--cache-dir", "gs://bucket/jax", "--max-size-bytes", "1000", "--local-dir", "off", expect=3)
    assert "does not work on a bucket" in proc.stderr and "prune" in proc.stderr and "local_dir" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory owned by another user needs root")
def test_directory_owned_by_another_user_is_refused(tmp_path):
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o755)
    os.chown(cache, 65534, 65534)
    found = trust.problems(str(cache))
    assert found and "owned by uid 65534" in found[0]


def test_trust_rules_for_parents(tmp_path):
    parent = tmp_path / "team"
    parent.mkdir()
    parent.chmod(0o777)
    assert any("writable by its group and everyone" in p for p in trust.problems(str(parent / "cache")))
    parent.chmod(0o1777)  # sticky, like /tmp: others cannot swap what we create there
    assert trust.problems(str(parent / "cache")) == []
    assert trust.problems(str(parent)) != [], "the cache directory itself must not be writable by others"
    parent.chmod(0o755)
    assert trust.problems(str(parent / "a" / "b")) == []


# --- options, without JAX ------------------------------------------------------------------------------------


def _resolve(cache_dir=None, env=None, **kw):
    args = dict(job=None, min_compile_time_secs=None, min_entry_size_bytes=None, xla_caches=None,
                max_size_bytes=None, service_url=None, token=None, trust="strict", default_xla_caches="none")
    args.update(kw)
    return client_options.resolve(cache_dir, env=env or {}, **args)


def test_options_resolution_order_and_checks(tmp_path):
    with pytest.raises(CacheNotConfiguredError, match="JAXCACHE_DIR"):
        _resolve()
    assert _resolve(env={"JAX_COMPILATION_CACHE_DIR": "/a/"}).cache_dir == "/a"
    assert _resolve(env={"JAX_COMPILATION_CACHE_DIR": "/a", "JAXCACHE_DIR": "/b"}).cache_dir == "/b"
    assert _resolve("/c", env={"JAXCACHE_DIR": "/b"}).cache_dir == "/c"
    assert _resolve("gs://bkt/x/y/").cache_dir == "gs://bkt/x/y"
    # Every store JAX's cache takes, spelled once (storage.normalise_root, as the service and the CLI spell it).
    assert _resolve("s3://bkt//x/y/").cache_dir == "s3://bkt/x/y" and _resolve(" az://ctr/x ").cache_dir == "az://ctr/x"
    for root in ("s3://bkt/x", "az://ctr/x"):
        on_store = _resolve(root, env={"JAXCACHE_LOCAL_DIR": "off"})
        assert on_store.jax_settings()["jax_persistent_cache_enable_xla_caches"] == "none", root
    opts = _resolve("/c", env={"JAXCACHE_MIN_COMPILE_TIME_S": "0.5", "JAXCACHE_MIN_ENTRY_SIZE_BYTES": "-1",
                               "JAXCACHE_JOB": "j", "JAXCACHE_SERVICE_URL": "http://svc:8080/",
                               "JAXCACHE_TOKEN": "t", "JAXCACHE_RECORD_EVERY_S": "30"})
    assert (opts.min_compile_time_secs, opts.min_entry_size_bytes, opts.job) == (0.5, -1, "j")
    assert (opts.service_url, opts.token, opts.record_every_s) == ("http://svc:8080", "t", 30.0)
    assert opts.jax_settings() == {
        "jax_compilation_cache_dir": "/c",
        "jax_persistent_cache_min_compile_time_secs": 0.5,
        "jax_persistent_cache_min_entry_size_bytes": -1,
        "jax_persistent_cache_enable_xla_caches": "none",
    }
    unset = _resolve("/c", default_xla_caches=None).jax_settings()
    assert unset == {"jax_compilation_cache_dir": "/c"}, "unset thresholds keep JAX's defaults"
    bad = [
        dict(cache_dir="/c", trust="maybe"),
        dict(cache_dir="/c", min_compile_time_secs=-1),
        dict(cache_dir="/c", min_compile_time_secs=float("nan")),
        dict(cache_dir="/c", min_compile_time_secs=float("inf")),
        dict(cache_dir="/c", min_entry_size_bytes=-2),
        dict(cache_dir="/c", env={"JAXCACHE_MIN_COMPILE_TIME_S": "soon"}),
        dict(cache_dir="/c", service_url="svc:8080"),
        dict(cache_dir="/c", job="a/b"),
        dict(cache_dir="/c", env={"JAXCACHE_RUN_ID": "../x"}),
        dict(cache_dir="s3a://b/x"),
        dict(cache_dir="az://account@ctr/x"),
        dict(cache_dir="s3://bucket/x", max_size_bytes=10, env={"JAXCACHE_LOCAL_DIR": "off"}),
        dict(cache_dir="az://ctr/x", xla_caches="all", env={"JAXCACHE_LOCAL_DIR": "off"}),
        dict(cache_dir="/c", local_dir="s3://bucket/tier"),
        dict(cache_dir="gs://bucket/x", max_size_bytes=10, env={"JAXCACHE_LOCAL_DIR": "off"}),
        dict(cache_dir="/c", env={"JAXCACHE_SIGNING_KEY": "/no/such/key"}),
    ]
    for case in bad:
        with pytest.raises(InvalidInputError):
            _resolve(**case)
    with pytest.raises(InvalidInputError, match="JAXCACHE_SIGNING_KEY: cannot read the signing key /no/such/key"):
        _resolve("/c", env={"JAXCACHE_SIGNING_KEY": "/no/such/key"})


def test_a_claimed_sessions_notice_says_what_did_not_apply(tmp_path):
    import logging

    from jaxcache.client import claim

    mine = _resolve(str(tmp_path / "c"), job="warmup", min_compile_time_secs=0.0, token="secret")
    level, text = claim.notice(mine, "the tool", {"cache_dir": f"{tmp_path}/c/", "job": "train",
                                                  "min_compile_time_secs": 0, "token": "other", "trust": "strict"})
    assert level == logging.INFO and "job='train' (the tool's: 'warmup')" in text
    assert "cache_dir" not in text and "min_compile_time_secs" not in text, "the same settings, spelled otherwise"
    assert "token" in text and "other" not in text and "secret" not in text
    level, text = claim.notice(mine, "the tool", {"cache_dir": "gs://elsewhere"})
    assert level == logging.WARNING and "another cache" in text
    assert claim.notice(mine, "the tool", {"trust": "strict"})[0] == logging.INFO


# --- telemetry out of the process ----------------------------------------------------------------------------



def test_service_down_the_job_completes_with_one_warning(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    proc = run_job("--cache-dir", str(tmp_path / "c"), "--service-url", url)
    assert proc.stderr.count("unreachable") == 1, proc.stderr
    assert "the job goes on" in proc.stderr
    assert read_record(tmp_path / "c", result(proc)["record_name"]).final


def test_records_are_rewritten_periodically_while_the_job_runs(tmp_path):
    cache = tmp_path / "c"
    job = subprocess.Popen([sys.executable, str(JOB), "--cache-dir", str(cache), "--sleep", "30"],
                           env=clean_env(JAXCACHE_RECORD_EVERY_S="0.2", JAXCACHE_RUN_ID="periodic"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        seen = None
        while time.monotonic() < deadline and job.poll() is None:
            found = list(cache.glob(".jaxcache/runs/*/periodic-p0.json"))
            if found:
                seen = records.parse(found[0].read_bytes())
                if len(seen.keys) >= 4:
                    break
            time.sleep(0.1)
        assert seen is not None and not seen.final and len(seen.keys) >= 4, seen
    finally:
        job.kill()
        job.communicate()


def test_two_process_distributed_cpu_job_writes_a_record_per_process(tmp_path):
    cache = tmp_path / "c"
    coordinator = f"127.0.0.1:{free_port()}"
    env = clean_env(JAXCACHE_RUN_ID="dist-run", JAXCACHE_JOB="dist")
    procs = [
        subprocess.Popen([sys.executable, str(JOB), "--cache-dir", str(cache), "--distributed", coordinator, "2",
                          str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, f"{out}\n{err}"
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sorted(r["process_index"] for r in results) == [0, 1]
    by_index = {r["process_index"]: r for r in results}
    recs = {i: read_record(cache, by_index[i]["record_name"]) for i in (0, 1)}
    assert recs[0].name.endswith("dist-run-p0.json") and recs[1].name.endswith("dist-run-p1.json")
    assert all(r.process_count == 2 and r.run_id == "dist-run" and r.topology == "1x2x1" for r in recs.values())
    assert by_index[0]["stats"]["writes"] >= 4 and by_index[1]["stats"]["writes"] == 0
    assert by_index[1]["stats"]["misses"] >= 4
    assert all(u.event == records.COMPILED and "only process 0" in u.reason for u in recs[1].keys)
    assert all(u.event == records.WRITE for u in recs[0].keys)


def test_an_object_store_root_gets_entries_run_records_and_signatures(store_root, tmp_path):
    """enable_cache() on a root in each store: the job's writes, signatures and run record reach the store; another
    node's job (an empty tier of its own) hits everything from the store, checking each signature, and a job that
    reads the store itself (no tier: JAX through etils epath and the store's fsspec filesystem) loads every entry
    but one whose bytes were changed there, which it skips."""
    from jaxcache import signing
    from jaxcache.storage import open_storage
    from store_servers import raw_names, raw_put

    url = store_root
    key = signing.new_key("store-writers", str(tmp_path / "w.key"))
    env = clean_env(JAXCACHE_SIGNING_KEY=str(tmp_path / "w.key"))
    first = result(run_job("--cache-dir", url, "--job", "store-job", "--local-dir", str(tmp_path / "node-a"),
                           env=env))
    assert first["stats"]["writes"] >= 4
    record = records.parse(open_storage(url).read(first["record_name"]))
    assert record.cache_dir == url and all(u.event == records.WRITE and u.size_bytes for u in record.keys)
    # Each write signed beside its entry, created as a new object (jobs' identities may not overwrite).
    names = raw_names(url)
    assert {u.key + "-cache" for u in record.keys} | {u.key + "-sig" for u in record.keys} <= names
    # Loads checked against the writers' key (verify="signed"), through a tier and straight from the store.
    checking = {**env, "JAXCACHE_TRUSTED_KEYS": key.public_text()}
    second = result(run_job("--cache-dir", url + "/", "--job", "store-job", "--local-dir", str(tmp_path / "node-b"),
                            "--verify", "signed", env=checking))
    assert second["stats"]["hit_rate"] == 1.0 and second["skipped"] == {}, second
    victim = record.keys[0].key
    store = open_storage(url)
    raw_put(url, f"{victim}-cache", store.read(f"{victim}-cache")[::-1])  # its signature no longer vouches for it
    third = result(run_job("--cache-dir", url, "--job", "store-job", "--local-dir", "off", "--verify", "signed",
                           env=checking))
    assert third["skipped"] == {victim: "digest differs"}, third["skipped"]
    assert third["stats"]["hits"] == len(record.keys) - 1, third["stats"]
    store.write_atomic(f"{victim}-cache", store.read(f"{victim}-cache")[::-1])  # as written: doctor finds it ok
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "doctor", url, "--verify", "--min-age", "0s", "--json"],
                          capture_output=True, text=True, timeout=120,
                          env=clean_env(JAXCACHE_TRUSTED_KEYS=key.public_text()))
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["counts"]["ok"] == report["checked"] >= 4, proc.stdout + proc.stderr


def test_client_imports_nothing_heavy():
    code = (
        "import sys, jaxcache.client\n"
        "heavy = [m for m in ('fastapi', 'sqlalchemy', 'pydantic', 'google.cloud.storage', 'httpx', 'uvicorn',"
        " 'tqdm', 'prometheus_client', 'starlette', 'cryptography') if m in sys.modules]\n"
        "print(heavy)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
