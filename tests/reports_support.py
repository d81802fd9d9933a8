"""What the run-record tests of the service share: records built by hand, the service over a copy of the real
cache (SQLite or PostgreSQL catalog), and small readers of its answers."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache import entry as fmt
from jaxcache import records
from jaxcache.records import Fingerprint, KeyUsage, RunRecord
from jaxcache.service.app import create_app
from jaxcache.service.settings import ServiceSettings

READ, ADMIN, REPORT = "read-token-123", "admin-token-456", "report-token-789"
H_READ, H_ADMIN, H_REPORT = ({"Authorization": f"Bearer {t}"} for t in (READ, ADMIN, REPORT))
DAY = 86400.0
NEW, OLD = "0.12.0", "0.10.2"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


#: Tests marked with this run on an SQLite and on a PostgreSQL catalog (the ``svc`` fixture's parameter).
BOTH = pytest.mark.parametrize("svc", ["sqlite", "postgresql"], indirect=True)


def settings(tmp_path: Path, caches: dict[str, str], db: str | None = None, **kw) -> ServiceSettings:
    return ServiceSettings(
        caches=caches, db=db or f"sqlite:///{tmp_path / 'catalog.sqlite'}", rescan_s=3600,
        tokens={sha(READ): "read", sha(ADMIN): "admin", sha(REPORT): "report"}, **kw,
    )


def age(root: Path, days: float) -> None:
    """Make every entry under root look created and last used ``days`` ago."""
    t = time.time() - days * DAY
    for p in root.iterdir():
        if p.is_file():
            if p.name.endswith("-atime"):
                p.write_bytes(fmt.encode_atime(int(t * 1e9)))
            os.utime(p, (t, t))


def run(job: str, run_id: str, keys: list[KeyUsage], *, at: float | None = None, jaxlib: str = NEW,
        topology: str | None = "1x1x1", process_index: int = 0, process_count: int = 1,
        cache_dir: str | None = None, host: str = "node-1", kind: records.RunKind = records.JOB) -> RunRecord:
    """A run record of one process, last updated at ``at`` (default now); ``kind`` says what wrote it."""
    at = time.time() if at is None else at
    return RunRecord(
        job=job, run_id=run_id, process_index=process_index, process_count=process_count, host=host,
        started_at=at - 60, updated_at=at, fingerprint=Fingerprint(jax=jaxlib, jaxlib=jaxlib, backend="cpu"),
        topology=topology, cache_dir=cache_dir, final=True, keys=keys, kind=kind,
    )


def write(key: str, compile_s: float, at: float) -> KeyUsage:
    return KeyUsage(key=key, event=records.WRITE, compiles=1, writes=1, compile_s=compile_s, first_at=at,
                    last_at=at)


def hit(key: str, hits: int, at: float, *, retrieval_s: float = 0.0, saved_s: float = 0.0) -> KeyUsage:
    return KeyUsage(key=key, event=records.HIT, hits=hits, retrieval_s=retrieval_s, saved_s=saved_s,
                    first_at=at - 1, last_at=at)


def compiled(key: str, compile_s: float, at: float, reason: str = "only process 0 writes the cache") -> KeyUsage:
    return KeyUsage(key=key, event=records.COMPILED, compiles=1, compile_s=compile_s, reason=reason, first_at=at,
                    last_at=at)


def keys_of(cache) -> dict[str, str]:
    """{module: key} of the test programs (compiled once each), plus "all": every key JAX wrote (some versions
    also cache helper programs, a few under one module name) and "rest": those besides train, tiny and odd."""
    found = {e["module"]: e["key"] for e in cache.entries}
    named = {m: found[m] for m in ("jit_train_step", "jit_tiny", "jit_odd-name.v2")}
    every = sorted(e["key"] for e in cache.entries)
    return {**named, "all": every, "rest": sorted(set(every) - set(named.values()))}


def put_record(root: Path, record: RunRecord) -> Path:
    path = root / record.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(record.to_json())
    return path


def entries(client, query: str = "", cache: str = "demo") -> dict[str, dict]:
    out, cursor = {}, None
    while True:
        url = f"/v1/caches/{cache}/entries?limit=2&{query}" + (f"&cursor={cursor}" if cursor else "")
        r = client.get(url, headers=H_READ)
        assert r.status_code == 200, r.text
        body = r.json()
        for e in body["entries"]:
            assert e["key"] not in out
            out[e["key"]] = e
        cursor = body["next_cursor"]
        if not cursor:
            return out


def rescan(client, cache: str = "demo") -> dict:
    r = client.post(f"/v1/caches/{cache}/rescan", headers=H_ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def report(client, record: RunRecord, query: str = "?cache=demo") -> dict:
    """POST a record that must be accepted, and wait until the catalog has folded it."""
    r = post(client, record, query)
    assert r.status_code == 202, r.text
    return r.json()


def folded(client, timeout_s: float = 60.0, headers=H_READ) -> None:
    """Wait until no accepted run record waits in any cache's inbox (the drain has folded them all)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = client.get("/v1/caches", headers=headers)
        assert r.status_code == 200, r.text
        if not any(c["reports_waiting"] for c in r.json()["caches"]):
            return
        assert time.monotonic() < deadline, f"records still waiting after {timeout_s} s: {r.json()}"
        time.sleep(0.02)


def counted(client, series: str, expected: float, timeout_s: float = 30.0) -> float:
    """The sum of the ``/metrics`` samples whose line starts with ``series`` (a counter's name and labels), once it
    reaches ``expected`` (or after ``timeout_s``, never asserted on). A drain moves its counts just after its
    commit: a moment after the catalog (and the inbox) show what it folded."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = sum(float(line.rsplit(" ", 1)[1]) for line in client.get("/metrics").text.splitlines()
                    if line.startswith(series))
        if value >= expected or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def post(client, record: RunRecord | bytes, query: str = "", headers=H_REPORT):
    """POST a record; once it is accepted (202), wait until the catalog has folded it."""
    body = record if isinstance(record, bytes) else record.to_json()
    r = client.post(f"/v1/reports{query}", content=body, headers={**headers, "content-type": "application/json"})
    if r.status_code == 202:
        folded(client)
    return r


def _service(request, tmp_path: Path, cache_copy: Path, **kw) -> Iterator[TestClient]:
    age(cache_copy, 10)
    db = request.getfixturevalue("pg_url") if getattr(request, "param", "sqlite") == "postgresql" else None
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}, db=db, **kw))) as client:
        settled(client)
        rescan(client)
        yield client


@pytest.fixture
def svc(request, tmp_path, cache_copy):
    yield from _service(request, tmp_path, cache_copy)


#: How often the ``metered`` service reads its usage gauges from the catalog (``JAXCACHE_USAGE_METRICS_S``).
USAGE_S = 0.2


@pytest.fixture
def metered(request, tmp_path, cache_copy):
    """``svc``, reading its usage gauges every :data:`USAGE_S`: for tests that scrape them after posting."""
    yield from _service(request, tmp_path, cache_copy, usage_metrics_s=USAGE_S)


def scraped(client, done: Callable[[str], bool], timeout_s: float = 30.0) -> str:
    """The first ``/metrics`` text that ``done`` accepts (the usage gauges are read again every
    ``JAXCACHE_USAGE_METRICS_S``, not at a scrape); a bound on waiting, not a timing."""
    deadline = time.monotonic() + timeout_s
    while not done(text := client.get("/metrics").text):
        assert time.monotonic() < deadline, f"/metrics never showed what the test waits for:\n{text}"
        time.sleep(0.05)
    return text


@pytest.fixture
def keys(jax_caches) -> dict[str, str]:
    k = keys_of(jax_caches["zstd"])
    assert k["rest"]
    return k
