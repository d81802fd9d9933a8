"""Verified loads (#34): with ``verify="attested"`` a job loads no entry the real service judged bad. A planted
entry (another program's bytes copied over one) and a truncated one are compiled instead, with the right results;
intact entries still hit; the run record, the summary and the service say why, which keys, and what removes them;
the job never refuses to start because of them. And the read hook itself, on both supported JAX versions."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from jaxcache import skips
from reports_support import counted, folded
from test_client_service import ADMIN, JOB, READ, REPORT, _env, api, service  # noqa: F401 - a fixture


@pytest.fixture(params=["jax-main", "jax-next"])
def interpreter(request) -> tuple[str, dict[str, str]]:
    if request.param == "jax-main":
        return sys.executable, {}
    return request.getfixturevalue("next_python_with_jaxcache")


def run_job(interpreter: tuple[str, dict[str, str]], cache: Path, job: str, *args: str) -> dict:
    python, extra = interpreter
    proc = subprocess.run([python, str(JOB), "--cache-dir", str(cache), "--job", job, *args], capture_output=True,
                          text=True, timeout=300, env={**_env(), **extra})
    assert proc.returncode == 0, proc.stdout + proc.stderr  # 1: a wrong result, 3: enable_cache refused
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _age(path: Path, seconds: float = 7200) -> None:
    """Older than the service's grace period, so a broken entry is judged, not pending."""
    old = time.time() - seconds
    os.utime(path, (old, old))


def _entry(cache: Path, function: str) -> Path:
    (found,) = cache.glob(f"jit_{function}-*-cache")
    return found


@pytest.mark.slow
def test_attested_jobs_compile_what_the_service_judged_bad_and_load_the_rest(service, interpreter):  # noqa: F811
    base, cache = service
    run_job(interpreter, cache, "writer")  # every entry attested by its writer
    affine, gram, wave = _entry(cache, "affine"), _entry(cache, "gram"), _entry(cache, "wave")
    gram.write_bytes(affine.read_bytes())  # planted: another program's bytes copied over gram's entry
    wave.write_bytes(wave.read_bytes()[: wave.stat().st_size // 2])  # truncated
    for path in (gram, wave):
        _age(path)
    api(base, "/v1/caches/shared/rescan", ADMIN, "POST")
    api(base, "/v1/caches/shared/verify", ADMIN, "POST")
    judged = {p["key"]: p["class"] for p in api(base, "/v1/caches/shared/integrity")["problems"]}
    bad = {k: v for k, v in judged.items() if v in skips.JUDGED_BAD}
    assert set(bad) == {p.name.removesuffix("-cache") for p in (gram, wave)}, judged

    # The job starts, computes the right numbers (client_job checks each result), and compiles exactly those.
    out = run_job(interpreter, cache, "careful", "--verify", "attested", "--service-url", base,
                  "--token", REPORT)
    assert out["skipped"] == bad
    stats = out["stats"]
    assert stats["hits"] >= 2 and stats["misses"] == 2, stats  # affine and grad (at least) still load
    assert stats["writes"] == 0 and stats["failed_writes"] == 0, "a skipped key is never the job's write"
    summary = out["summary"]
    assert "2 skipped" in summary and all(k in summary for k in bad), summary
    assert "--integrity tampered,mismatched,corrupt --apply" in summary and "rm " in summary

    record = json.loads((cache / out["record_name"]).read_text())
    usage = {u["key"]: u for u in record["keys"]}
    for key, why in bad.items():
        assert usage[key]["event"] == "compiled" and usage[key]["writes"] == 0
        assert usage[key]["reason"] == skips.reason(why)
    # JAX never overwrites: the bad entries are still there, as they were.
    assert gram.read_bytes() == affine.read_bytes()

    # The service counts the misses as skipped, with the reason and the command, and no first write by the job.
    with httpx.Client(base_url=base, timeout=30) as client:
        folded(client, headers={"Authorization": f"Bearer {READ}"})
        assert counted(client, 'jaxcache_misses_total{cache="shared",cause="skipped"}', 2) == 2
    detail = api(base, "/v1/caches/shared/jobs/careful")
    assert detail["writes"] == 0
    missed = {m["key"]: m for m in detail["missed"]}
    assert set(missed) == set(bad), missed
    for key, why in bad.items():
        assert missed[key]["cause"] == "skipped" and f"({why})" in missed[key]["fix"], missed[key]
        assert "--integrity" in missed[key]["fix"] and not missed[key]["written"]
    entries = {e["key"]: e for e in api(base, "/v1/caches/shared/entries?limit=1000")["entries"]}
    assert all((entries[k].get("first_writer") or {}).get("job") != "careful" for k in bad if k in entries)


# The hook alone, on each JAX and on both kinds of root: a judge refuses one program's entry, given the bytes JAX
# read; that program is compiled (and JAX's put, finding the entry there, writes nothing over it) while the other
# loads. The judge records what it was handed, so the test can compare it with what the cache holds.
_HOOK = textwrap.dedent("""
    import hashlib, json, os, sys, warnings
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, numpy as np
    from jaxcache.client import enable_cache
    from jaxcache.client.loads import LoadGuard, LoadPolicy
    session = enable_cache(sys.argv[1], min_compile_time_secs=0, min_entry_size_bytes=-1, trust="off", job="hook")
    refused, seen = set(json.loads(sys.argv[2])), {}
    def judge(key, data):
        seen[key] = hashlib.sha256(data).hexdigest()
        return "refused" if key in refused else None
    guard = LoadGuard(LoadPolicy("test", judge))
    guard.install()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = jax.jit(lambda v: v * 2.0 + 1.0)(np.arange(4.0, dtype=np.float32))
        b = jax.jit(lambda v: v - 3.0)(np.arange(4.0, dtype=np.float32))
    assert np.allclose(a, np.arange(4.0) * 2 + 1) and np.allclose(b, np.arange(4.0) - 3)
    s = session.stats()
    print(json.dumps({"skipped": guard.skipped(), "seen": seen, "hits": s.hits, "misses": s.misses,
                      "warnings": [str(w.message) for w in caught], "jax": jax.__version__}))
""")


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path) -> tuple[str, object]:
    """A cache root, and how to read an entry's bytes there by file name."""
    if request.param == "local":
        return str(tmp_path / "cache"), lambda name: (tmp_path / "cache" / name).read_bytes()
    bucket_name = request.getfixturevalue("gcs_bucket")
    bucket = request.getfixturevalue("gcs_client").bucket(bucket_name)
    return f"gs://{bucket_name}/jax-cache", lambda name: bucket.blob(f"jax-cache/{name}").download_as_bytes()


def test_the_read_hook_judges_the_bytes_jax_read_on_every_supported_jax(interpreter, root, tmp_path):
    python, extra = interpreter
    url, read = root
    if url.startswith("gs://") and subprocess.run([python, "-c", "import etils.epath, gcsfs"]).returncode:
        pytest.skip(f"{python} lacks the client's gcs extras (etils, gcsfs), so its JAX cannot reach gs://: "
                    "`make test` installs them")

    def run(refused: list[str]) -> dict:
        proc = subprocess.run([python, "-c", _HOOK, url, json.dumps(refused)], capture_output=True, cwd=tmp_path,
                              text=True, timeout=300, env={**os.environ, **extra})
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = run([])
    assert first["misses"] >= 2 and not first["skipped"] and not first["seen"]
    written = run([])["seen"]  # a second run loads them all, each judged once, on exactly the stored bytes
    victim = sorted(k for k in written if k.startswith("jit__lambda-"))[0]
    assert all(digest == hashlib.sha256(read(f"{k}-cache")).hexdigest() for k, digest in written.items())
    before = read(f"{victim}-cache")
    again = run([victim])
    assert again["skipped"] == {victim: "refused"}, again
    assert again["hits"] >= 1 and again["misses"] >= 1 and again["warnings"] == [], again
    assert read(f"{victim}-cache") == before, "JAX wrote nothing over the refused entry"
