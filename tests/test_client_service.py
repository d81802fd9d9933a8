"""Client and service together, as deployed: jobs using enable_cache() report to a real `jaxcache serve`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from conftest import jaxcache_serve
from jaxcache import signing
from ports import free_port
from reports_support import folded

JOB = Path(__file__).parent / "programs" / "client_job.py"
ADMIN, REPORT, READ = "cs-admin", "cs-report", "cs-read"
#: Writers sign with its private half and the service trusts its public half: a mismatch is proof of tampering.
KEY_PATH = str(Path(tempfile.mkdtemp(prefix="jaxcache-cs-")) / "writers.key")
PUBLIC = signing.new_key("writers", KEY_PATH).public_text()



def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_COMPILATION_CACHE"))}
    return {**env, "JAX_PLATFORMS": "cpu", "JAXCACHE_SIGNING_KEY": KEY_PATH, **extra}


@pytest.fixture
def service(tmp_path):
    """`jaxcache serve` over an empty cache directory, with admin, report and read tokens."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    with jaxcache_serve({"shared": cache}, f"sqlite:///{tmp_path / 'catalog.sqlite'}",
                        tokens={ADMIN: "admin", REPORT: "report", READ: "read"}, JAXCACHE_TRUSTED_KEYS=PUBLIC) as base:
        yield base, cache


def run_job(cache: Path, job: str, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(cache), "--job", job, *args],
                          capture_output=True, text=True, timeout=300, env=env or _env())
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

    # Reported over HTTP (accepted, 202): the job is known before any rescan, once the drain has folded its record.
    with httpx.Client(base_url=base, timeout=30) as client:
        folded(client, headers={"Authorization": f"Bearer {READ}"})
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
def test_verify_attested_starts_on_a_tampered_cache_and_compiles_the_tampered_entry(service):
    base, cache = service
    run_job(cache, "writer")  # signed entries: the writer signed the bytes JAX put
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
    assert proc.returncode == 0, proc.stderr  # the right results: the swapped entry was compiled, not loaded
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(out["skipped"]) == [victim.name.removesuffix("-cache")]
    assert out["stats"]["hits"] == clean["stats"]["hits"] - 1 and out["stats"]["writes"] == 0
    assert victim.name.removesuffix("-cache") in proc.stderr  # one warning at start names it and the fix
    assert "--integrity tampered,mismatched,corrupt --apply" in proc.stderr


@pytest.mark.slow
def test_verify_sample_flags_hits_whose_bytes_differ_from_a_trusted_signature(tmp_path):
    cache = tmp_path / "cache"
    writer = run_job(cache, "writer")
    # The writer's record edited after the fact: an unsigned digest proves nothing, and the signature vouches for
    # the bytes, so the job finds nothing.
    record_path = cache / writer["record_name"]
    data = json.loads(record_path.read_text())
    data["keys"][0]["sha256"] = "0" * 64
    record_path.write_text(json.dumps(data))
    out = run_job(cache, "sampler", "--verify", "sample", env=_env(JAXCACHE_TRUSTED_KEYS=PUBLIC))
    assert out["stats"]["hit_rate"] == 1.0 and out["integrity_findings"] == []
    # affine's bytes under wave's key (bucket write access; both take one f32 vector): the job calling wave gets
    # affine's answer as a hit, and says that entry is tampered.
    (affine,), (wave,) = cache.glob("jit_affine-*-cache"), cache.glob("jit_wave-*-cache")
    wave.write_bytes(affine.read_bytes())
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(cache), "--job", "sampler-2", "--verify",
                           "sample"], capture_output=True, text=True, timeout=300,
                          env=_env(JAXCACHE_TRUSTED_KEYS=PUBLIC))
    assert proc.returncode == 1 and "wave: got" in proc.stderr, proc.stderr
    assert f"loaded {wave.name.removesuffix('-cache')} from the cache and it is tampered" in proc.stderr


def test_verify_attested_fails_closed_on_settings_the_service_refuses(service):
    """A token, route or cache_dir the service refuses is a setting to fix: starting would skip the check."""
    from jaxcache.client import IntegrityCheckError
    from jaxcache.client.verify import attested_policy

    base, cache = service
    policy = attested_policy(base, REPORT, str(cache))  # the right settings on a clean cache: loads everything
    assert policy is not None and policy.judge("jit_f-" + "0" * 64, b"entry") is None
    cases = [(base, "not-a-token", str(cache), "HTTP 401", "JAXCACHE_TOKEN"),
             (base, REPORT, str(cache.parent / "elsewhere"), "HTTP 404", "pass the cache_dir the service is"),
             (f"{base}/wrong-prefix", REPORT, str(cache), "HTTP 404", "JAXCACHE_SERVICE_URL"),
             (base, REPORT, "relative/cache", "HTTP 422", "pass the cache_dir the service is")]
    for url, token, cache_dir, status, fix in cases:
        with pytest.raises(IntegrityCheckError) as info:
            attested_policy(url, token, cache_dir)
        assert status in str(info.value) and fix in str(info.value) and "verify='off'" in str(info.value)


def test_verify_attested_starts_with_one_warning_when_the_service_is_down(caplog):
    import http.server
    import threading

    from jaxcache.client.verify import attested_policy

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
            assert attested_policy(f"http://127.0.0.1:{server.server_address[1]}", REPORT, "/cache") is None
            assert attested_policy(f"http://127.0.0.1:{free_port()}", REPORT, "/cache") is None  # nothing listens
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


# --------------------------------------------------------------------------------------------------------------
# A slow or overloaded service: the job never waits for it, and its record file reaches the catalog by rescan


class HoldingProxy:
    """Between the job and the service: forwards each request at once and holds the service's answer until
    :meth:`release`, as a service too slow for the job's timeout would (it did the work; the job never hears)."""

    def __init__(self, target: str) -> None:
        import threading

        self.target = target.removeprefix("http://").rsplit(":", 1)
        self.held: list[bytes] = []
        self._release = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            # urllib asks for Connection: close, so the service's answer ends where its connection does.
            with socket.create_connection((self.target[0], int(self.target[1]))) as upstream:
                upstream.sendall(head + b"\r\n\r\n" + body)
                answer = b""
                while chunk := upstream.recv(65536):
                    answer += chunk
            self.held.append(answer)
            self._release.wait()
            with contextlib.suppress(OSError):  # the job gave up long ago
                conn.sendall(answer)

    def release(self) -> None:
        self._release.set()
        self._server.close()


def _job_env(**extra: str) -> dict[str, str]:
    return _env(JAXCACHE_RECORD_EVERY_S="3600", **extra)  # one POST, at exit


def _counted_once(base: str, job: str, stats: dict) -> None:
    summary = api(base, f"/v1/caches/shared/jobs/{job}")
    assert summary["processes"] == 1 and summary["runs"] == 1
    assert (summary["hits"], summary["writes"]) == (stats["hits"], stats["writes"])


@pytest.mark.slow
def test_a_job_does_not_wait_for_a_slow_service_and_a_rescan_counts_its_record_once(service):
    base, cache = service
    proxy = HoldingProxy(base)
    try:
        proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(cache), "--job", "patient",
                               "--service-url", proxy.url, "--token", REPORT],
                              capture_output=True, text=True, timeout=300, env=_job_env())
        # The job is done while the service's answer (it took the record) is still held: it did not wait for it.
        assert proc.returncode == 0, proc.stderr
        assert proxy.held and all(b" 202 Accepted" in answer.split(b"\r\n")[0] for answer in proxy.held)
        assert proc.stderr.count("unreachable") == 1 and "timed out" in proc.stderr, proc.stderr
    finally:
        proxy.release()
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    api(base, "/v1/caches/shared/rescan", ADMIN, "POST")  # the record file, the same record again
    _counted_once(base, "patient", out["stats"])


@pytest.mark.slow
def test_a_job_refused_by_a_full_inbox_goes_on_and_a_rescan_ingests_its_record(tmp_path, pg_url):
    """A real service whose drain waits for the cache's write lock (this test holds it, as another replica's drain
    would) and whose inbox holds two records: the job's POST is answered 503 at once, and its record file reaches
    the catalog later."""
    from sqlalchemy import create_engine, text

    from jaxcache.service.catalog.coordination import advisory_key

    cache = tmp_path / "cache"
    cache.mkdir()
    with jaxcache_serve({"shared": cache}, pg_url, tokens={ADMIN: "admin", REPORT: "report", READ: "read"},
                        args=("--workers", "1"), JAXCACHE_REPORT_INBOX="2", JAXCACHE_TRUSTED_KEYS=PUBLIC) as base:
        engine = create_engine(pg_url)
        with engine.connect() as held:
            held.execute(text("SELECT pg_advisory_lock(:k)"), {"k": advisory_key("write:shared")})
            headers = {"Authorization": f"Bearer {REPORT}", "content-type": "application/json"}
            for i in range(2):  # accepted; the drain waits for the lock, so they stay in the inbox
                answer = httpx.post(f"{base}/v1/reports?cache=shared", content=_filler(cache, i), timeout=60,
                                    headers=headers)
                assert answer.status_code == 202, answer.text
            refused = httpx.post(f"{base}/v1/reports?cache=shared", content=_filler(cache, 2), timeout=60,
                                 headers=headers)
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1, refused.text
            proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(cache), "--job", "refused",
                                   "--service-url", base, "--token", REPORT],
                                  capture_output=True, text=True, timeout=300, env=_job_env())
            assert proc.returncode == 0, proc.stderr
            assert proc.stderr.count("refused the run record: HTTP 503") == 1, proc.stderr
            held.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": advisory_key("write:shared")})
        engine.dispose()
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert "refused" not in {j["job"] for j in api(base, "/v1/caches/shared/jobs")["jobs"]}
        assert api(base, "/v1/caches/shared/rescan", ADMIN, "POST")["records_ingested"] >= 1
        _counted_once(base, "refused", out["stats"])


def _filler(cache: Path, i: int) -> bytes:
    from jaxcache import records

    at = time.time()
    return records.RunRecord(
        job="filler", run_id=f"filler-{i}", process_index=0, process_count=1, host="h", started_at=at - 1,
        updated_at=at, fingerprint=records.Fingerprint(jax="0.12.0", jaxlib="0.12.0"), cache_dir=str(cache),
        keys=[records.KeyUsage(key=f"jit_f-{i:064x}", event=records.HIT, hits=1, first_at=at)]).to_json()
