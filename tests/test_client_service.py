"""Client and service together, as deployed: jobs using enable_cache() report to a real `jaxcache serve`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import jaxcache_serve

JOB = Path(__file__).parent / "programs" / "client_job.py"
ADMIN, REPORT, READ = "cs-admin", "cs-report", "cs-read"
#: Writers and the service share it: digests are signed, so a mismatch against one is proof of tampering.
KEY = "cs-attest-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_COMPILATION_CACHE"))}
    return {**env, "JAX_PLATFORMS": "cpu", "JAXCACHE_ATTEST_KEY": KEY, **extra}


@pytest.fixture
def service(tmp_path):
    """`jaxcache serve` over an empty cache directory, with admin, report and read tokens."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    with jaxcache_serve({"shared": cache}, f"sqlite:///{tmp_path / 'catalog.sqlite'}",
                        tokens={ADMIN: "admin", REPORT: "report", READ: "read"}, JAXCACHE_ATTEST_KEY=KEY) as base:
        yield base, cache


def run_job(cache: Path, job: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(cache), "--job", job, *args],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unreachable" not in proc.stderr and "refused" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def api(base: str, path: str, token: str = READ, method: str = "GET") -> dict:
    response = httpx.request(method, f"{base}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
def test_jobs_report_to_the_service_and_entries_carry_their_writer(service):
    base, cache = service
    first = run_job(cache, "trainer", "--service-url", base, "--token", REPORT)
    assert first["stats"]["writes"] >= 4

    # Reported over HTTP: the job is known before any rescan.
    jobs = api(base, "/v1/caches/shared/jobs")
    (trainer,) = [j for j in jobs["jobs"] if j["job"] == "trainer"]
    assert trainer["writes"] == first["stats"]["writes"] and trainer["hits"] == 0

    api(base, "/v1/caches/shared/rescan", ADMIN, "POST")
    listed = api(base, "/v1/caches/shared/entries?job=trainer&limit=1000")["entries"]
    assert len(listed) == first["stats"]["writes"]
    assert all(e["first_writer"]["job"] == "trainer" and e["first_writer"]["topology"] == "1x1x1" for e in listed)
    assert all(e["measured_compile_s"] and e["measured_compile_s"] > 0 for e in listed)

    # A second job reads the cache and reports nothing over HTTP: its record file reaches the catalog by rescan.
    second = run_job(cache, "evaluator")
    assert second["stats"]["hit_rate"] == 1.0
    api(base, "/v1/caches/shared/rescan", ADMIN, "POST")
    evaluator = api(base, "/v1/caches/shared/jobs/evaluator")
    assert evaluator["hits"] == second["stats"]["hits"] and evaluator["hit_rate"] == 1.0
    hit = api(base, "/v1/caches/shared/entries?job=evaluator&sort=hits&order=desc&limit=1000")["entries"]
    assert len(hit) == second["stats"]["hits"] and all(e["hits"] >= 1 for e in hit)
    assert all(e["first_writer"]["job"] == "trainer" for e in hit), "the writer stays the first job"


@pytest.mark.slow
def test_a_read_token_cannot_report_and_the_job_still_finishes(service):
    base, cache = service
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(cache), "--job", "sneaky", "--service-url",
                           base, "--token", READ], capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("refused the run record: HTTP 403") == 1, proc.stderr
    jobs = api(base, "/v1/caches/shared/jobs")["jobs"]
    assert not [j for j in jobs if j["job"] == "sneaky"]


@pytest.mark.slow
def test_verify_attested_refuses_a_tampered_cache_and_sample_warns(service):
    base, cache = service
    run_job(cache, "writer")  # attested entries: the writer read back and recorded each digest
    clean = run_job(cache, "checked", "--verify", "attested", "--service-url", base, "--token", REPORT)
    assert clean["stats"]["hit_rate"] == 1.0

    # Someone with write access swaps one entry's bytes for another program's.
    entries = sorted(cache.glob("*-cache"), key=lambda p: p.name)
    victim = entries[1]
    victim.write_bytes(entries[0].read_bytes())
    old = time.time() - 7200
    os.utime(victim, (old, old))
    api(base, "/v1/caches/shared/rescan", ADMIN, "POST")
    api(base, "/v1/caches/shared/verify", ADMIN, "POST")

    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(cache), "--job", "careful", "--verify",
                           "attested", "--service-url", base, "--token", REPORT],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 3, proc.stderr
    assert "TamperedCacheError" in proc.stderr and victim.name.removesuffix("-cache") in proc.stderr
    assert "--integrity tampered,mismatched,differs,corrupt --apply" in proc.stderr


@pytest.mark.slow
def test_verify_sample_flags_hits_whose_bytes_differ_from_the_writers_digest(tmp_path):
    cache = tmp_path / "cache"
    writer = run_job(cache, "writer")
    # The writer's record says one digest and the entry's bytes another: the record edited after the fact (its
    # signature no longer matches, so the digest is worth a file's). The job warns: the entry differs.
    record_path = cache / writer["record_name"]
    data = json.loads(record_path.read_text())
    target = data["keys"][0]["key"]
    data["keys"][0]["sha256"] = "0" * 64
    record_path.write_text(json.dumps(data))
    out = run_job(cache, "sampler", "--verify", "sample")
    assert out["stats"]["hit_rate"] == 1.0
    assert out["integrity_findings"] == [{"key": target, "class": "differs"}]


def test_verify_attested_fails_closed_on_settings_the_service_refuses(service):
    """A token, route or cache_dir the service refuses is a setting to fix: starting would skip the check."""
    from jaxcache.client import IntegrityCheckError
    from jaxcache.client.verify import check_attested

    base, cache = service
    check_attested(base, REPORT, str(cache))  # the right settings on a clean cache: no complaint
    cases = [(base, "not-a-token", str(cache), "HTTP 401", "JAXCACHE_TOKEN"),
             (base, REPORT, str(cache.parent / "elsewhere"), "HTTP 404", "pass the cache_dir the service is"),
             (f"{base}/wrong-prefix", REPORT, str(cache), "HTTP 404", "JAXCACHE_SERVICE_URL")]
    for url, token, cache_dir, status, fix in cases:
        with pytest.raises(IntegrityCheckError) as info:
            check_attested(url, token, cache_dir)
        assert status in str(info.value) and fix in str(info.value) and "verify='off'" in str(info.value)


def test_verify_attested_starts_with_one_warning_when_the_service_is_down(caplog):
    import http.server
    import threading

    from jaxcache.client.verify import check_attested

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"catalog unreachable")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with caplog.at_level("WARNING", logger="jaxcache.client"):
            check_attested(f"http://127.0.0.1:{server.server_address[1]}", REPORT, "/cache")
            check_attested(f"http://127.0.0.1:{_free_port()}", REPORT, "/cache")  # nothing listens there
    finally:
        server.shutdown()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("starting without the check" in m for m in messages), messages
    assert "HTTP 503" in messages[0] and "could not reach" in messages[1]


@pytest.mark.slow
def test_a_job_with_a_refused_token_does_not_start(service):
    base, cache = service
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(cache), "--job", "typo", "--verify",
                           "attested", "--service-url", base, "--token", "not-a-token"],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 3, proc.stderr
    assert "IntegrityCheckError" in proc.stderr and "HTTP 401" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(cache.glob("*-cache")), "nothing compiled into the cache"
