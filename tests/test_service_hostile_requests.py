"""Hostile requests to `jaxcache serve` over real HTTP (#58, kept from the red team's round two): bodies over the
limit (declared or chunked), gzip-encoded bodies (never inflated), bodies nested deeper than a parser recurses, and
1 MiB query strings. Each is answered with a 4xx in one JSON line (or uvicorn's 400), stores nothing, and the
service goes on serving; the server's log holds no traceback."""

from __future__ import annotations

import gzip
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from conftest import serve_env, start_serve, stop_serve, wait_ready
from reports_support import hit, run

ADMIN, REPORT, READ = "hr-admin", "hr-report", "hr-read"
H_ADMIN = {"Authorization": f"Bearer {ADMIN}", "content-type": "application/json"}
H_REPORT = {"Authorization": f"Bearer {REPORT}", "content-type": "application/json"}
H_READ = {"Authorization": f"Bearer {READ}"}
PRUNE, REPORTS = "/v1/caches/demo/prune", "/v1/reports?cache=demo"
LIMITS = {PRUNE: 64 * 1024, REPORTS: 8 * 1024 * 1024}  # the defaults: JAXCACHE_MAX_BODY_BYTES, _MAX_REPORT_BYTES
KEY = f"jit_f-{'0' * 64}"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[str, object]]:
    """One `jaxcache serve` process (one worker) over an empty cache, for the module: its base URL, and its log."""
    tmp = tmp_path_factory.mktemp("hostile-requests")
    (tmp / "cache").mkdir()
    log = tmp / "serve.log"
    proc, base = start_serve({"demo": tmp / "cache"}, f"sqlite:///{tmp / 'catalog.sqlite'}",
                             env=serve_env({ADMIN: "admin", REPORT: "report", READ: "read"}),
                             args=("--workers", "1"), stdout=log.open("w"))
    try:
        wait_ready(proc, base, output=log.read_text)
        yield base, log
    finally:
        stop_serve(proc)
    assert "Traceback" not in log.read_text(), log.read_text()


def _record(job: str = "hostile") -> bytes:
    return run(job, "r1", [hit(KEY, 1, time.time())]).to_json()


def _unchanged(base: str) -> None:
    """Nothing was stored (no job, no prune), and the service still answers."""
    assert httpx.get(f"{base}/readyz", timeout=30).status_code == 200
    jobs = httpx.get(f"{base}/v1/caches/demo/jobs", headers=H_READ, timeout=30).json()["jobs"]
    assert "hostile" not in {j["job"] for j in jobs}
    assert httpx.get(f"{base}/v1/caches/demo/prunes", headers=H_READ, timeout=30).json()["prunes"] == []


def _chunks(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    """``data`` as a generator: httpx sends it chunked, with no Content-Length."""
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.mark.parametrize("path", [PRUNE, REPORTS], ids=["prune", "report"])
@pytest.mark.parametrize("sent", ["declared", "chunked"])
def test_a_body_over_the_limit_is_413_however_it_is_sent(served, path, sent):
    base, _ = served
    body = b" " * (LIMITS[path] + 1)
    headers = H_ADMIN if path == PRUNE else H_REPORT
    r = httpx.post(f"{base}{path}", content=body if sent == "declared" else _chunks(body), headers=headers,
                   timeout=60)
    assert r.status_code == 413 and r.json() == {"detail": f"request body over {LIMITS[path]} bytes"}, r.text
    _unchanged(base)


def test_a_chunked_report_within_the_limit_is_read_whole(served):
    base, _ = served
    r = httpx.post(f"{base}{REPORTS}", content=_chunks(_record("chunked"), 100), headers=H_REPORT, timeout=60)
    assert r.status_code == 202 and r.json()["keys"] == 1, r.text


@pytest.mark.parametrize(("path", "body", "status", "said"), [
    (REPORTS, _record(), 422, "run record is not JSON"),
    (REPORTS, b"[" * (50 << 20), 422, "run record is not JSON"),  # 50 MiB in 50 KB: never inflated
    (PRUNE, b" " * (50 << 20), 400, "There was an error parsing the body"),
], ids=["a record", "a bomb as a report", "a bomb as a prune"])
def test_a_gzip_encoded_body_is_never_inflated(served, path, body, status, said):
    base, _ = served
    packed = gzip.compress(body)
    assert len(packed) < LIMITS[PRUNE]
    headers = {**(H_ADMIN if path == PRUNE else H_REPORT), "content-encoding": "gzip"}
    r = httpx.post(f"{base}{path}", content=packed, headers=headers, timeout=60)
    assert r.status_code == status and said in r.json()["detail"], r.text
    _unchanged(base)


@pytest.mark.parametrize(("path", "body", "status"), [
    (PRUNE, b'{"corrupt": true, "functions": ' + b"[" * 32_000 + b"]" * 32_000 + b"}", 400),  # within 64 KiB
    (REPORTS, b"[" * 1_000_000 + b"]" * 1_000_000, 422),
    (REPORTS, _record()[:-1] + b',"extra":' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}", 422),
], ids=["prune", "report", "report with a nested extra field"])
def test_a_body_nested_deeper_than_parsers_recurse_is_one_answer(served, path, body, status):
    base, _ = served
    r = httpx.post(f"{base}{path}", content=body, headers=H_ADMIN if path == PRUNE else H_REPORT, timeout=60)
    assert r.status_code == status and isinstance(r.json()["detail"], str), r.text
    _unchanged(base)


def _raw_get(base: str, target: bytes) -> bytes:
    """GET ``target`` on a socket of its own (httpx refuses to send a URL this long), the answer's status line."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + READ.encode()
                  + b"\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("target", [
    b"/v1/caches/demo/entries?function=" + b"x" * (1 << 20),
    b"/v1/caches/demo/entries?" + b"a=1&" * (1 << 18),
    b"/caches/demo/entries?job=" + b"x" * (1 << 20),
    b"/login?next=/" + b"x" * (1 << 20),
], ids=["API filter", "API, 262,144 parameters", "page filter", "login's next"])
def test_a_1_mib_query_string_is_refused_by_the_server_and_it_keeps_serving(served, target):
    base, _ = served
    assert _raw_get(base, target) == b"HTTP/1.1 400 Bad Request"
    _unchanged(base)


def test_a_long_query_string_the_server_passes_on_is_answered(served):
    base, _ = served
    r = httpx.get(f"{base}/v1/caches/demo/entries?function={'x' * 60_000}", headers=H_READ, timeout=60)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "string_too_long", r.text[:300]
    r = httpx.get(f"{base}/v1/caches/demo/entries?{'a=1&' * 15_000}limit=5", headers=H_READ, timeout=60)
    assert r.status_code == 200 and r.json()["entries"] == [], r.text[:300]
    _unchanged(base)
