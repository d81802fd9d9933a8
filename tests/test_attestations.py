"""Digests nobody can forge: the first digest the service accepts counts (by its clock), signed digests outrank
reported ones and reported ones outrank records read from the bucket, every other digest is kept as a conflict,
and a mismatch against a record file is `differs`, not proof of tampering. On SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from jaxcache import attestations, integrity, records
from jaxcache.entry import parse_name
from jaxcache.records import Fingerprint, KeyUsage, RunRecord
from jaxcache.scan import Entry
from jaxcache.service.app import create_app
from jaxcache.service.settings import ServiceSettings

ADMIN, REPORT, READ = "a-admin", "a-report", "a-read"
KEY = "a-attest-key"
BOTH = pytest.mark.parametrize("backend", ["sqlite", "postgresql"])


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _record(run_id: str, usages: list[KeyUsage], *, at: float, backend: str = "cpu") -> RunRecord:
    return RunRecord(job=f"job-{run_id}", run_id=run_id, process_index=0, process_count=1, host="h",
                     started_at=at, updated_at=at, fingerprint=Fingerprint(jax="0.10.2", jaxlib="0.10.2",
                                                                           backend=backend), keys=usages)


def _usage(key: str, sha: str, *, at: float, signed: bool = False) -> KeyUsage:
    signature = attestations.sign(KEY.encode(), key, sha) if signed else None
    return KeyUsage(key=key, event=records.WRITE, writes=1, compiles=1, sha256=sha, first_at=at, signature=signature)


@pytest.fixture
def cache(tmp_path, cache_copy) -> tuple[Path, str, str]:
    """A copy of real entries, old enough to be judged (no grace), and one key with its true digest."""
    old = time.time() - 7200
    for p in cache_copy.glob("*-cache"):
        import os

        os.utime(p, (old, old))
    path = sorted(cache_copy.glob("*-cache"))[0]
    return cache_copy, path.name.removesuffix("-cache"), hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def client(request, tmp_path, cache, backend):
    db = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'c.sqlite'}"
    tokens = {hashlib.sha256(t.encode()).hexdigest(): s for t, s in ((ADMIN, "admin"), (REPORT, "report"),
                                                                       (READ, "read"))}
    app = create_app(ServiceSettings(caches={"c": str(cache[0])}, db=db, tokens=tokens, rescan_s=3600,
                                     attest_key=KEY))
    # No `with`: the background loops stay off, so only what the test does happens.
    c = TestClient(app)
    assert c.post("/v1/caches/c/rescan", headers=_h(ADMIN)).status_code == 200
    return c


def _relist(client: TestClient) -> None:
    """The next rescan lists every record, as a process's first does: a record planted in a day folder as old as
    its back-dated start (1970) is otherwise read by the daily full listing, not by every rescan."""
    client.app.state.jaxcache.catalog.record_listings.clear()


def _post(client: TestClient, record: RunRecord) -> None:
    r = client.post("/v1/reports?cache=c", content=record.to_json(), headers=_h(REPORT))
    assert r.status_code == 202, r.text
    # The background loops are off here: a rescan drains the inbox.
    assert client.post("/v1/caches/c/rescan", headers=_h(ADMIN)).status_code == 200


def _integrity(client: TestClient) -> dict:
    assert client.post("/v1/caches/c/verify", json={"recheck_all": True}, headers=_h(ADMIN)).status_code == 200
    return client.get("/v1/caches/c/integrity", headers=_h(READ)).json()


@BOTH
def test_a_later_or_backdated_report_cannot_replace_the_accepted_digest(client, cache):
    _, key, true_sha = cache
    now = time.time()
    _post(client, _record("honest", [_usage(key, true_sha, at=now)], at=now))
    # A report-token holder claims another digest for the key, back-dating its record to before the writer's.
    _post(client, _record("forger", [_usage(key, "f" * 64, at=1.0)], at=1.0))
    summary = _integrity(client)
    assert key not in {p["key"] for p in summary["problems"]}, "the accepted digest still counts: the entry is ok"
    (conflict,) = summary["conflicts"]
    assert conflict["key"] == key and conflict["sha256"] == true_sha and conflict["source"] == "reported"
    assert [(o["sha256"], o["writer"]) for o in conflict["others"]] == [("f" * 64, "job job-forger run forger p0")]


@BOTH
def test_a_record_file_never_overrides_an_accepted_digest_and_only_differs(client, cache):
    root, key, true_sha = cache
    now = time.time()
    _post(client, _record("honest", [_usage(key, true_sha, at=now)], at=now))
    forged = _record("in-bucket", [_usage(key, "e" * 64, at=1.0)], at=1.0)
    (root / forged.name).parent.mkdir(parents=True, exist_ok=True)
    (root / forged.name).write_bytes(forged.to_json())
    _relist(client)
    client.post("/v1/caches/c/rescan", headers=_h(ADMIN))
    summary = _integrity(client)
    assert key not in {p["key"] for p in summary["problems"]}
    assert [o["source"] for o in summary["conflicts"][0]["others"]] == ["file"]


@BOTH
def test_a_mismatch_against_a_record_file_is_differs_naming_the_file(client, cache):
    root, key, _ = cache
    forged = _record("in-bucket", [_usage(key, "d" * 64, at=1.0)], at=1.0)
    (root / forged.name).parent.mkdir(parents=True, exist_ok=True)
    (root / forged.name).write_bytes(forged.to_json())
    _relist(client)
    client.post("/v1/caches/c/rescan", headers=_h(ADMIN))
    (problem,) = _integrity(client)["problems"]
    assert problem["key"] == key and problem["class"] == "differs"
    assert f"in the record {forged.name}" in problem["reasons"][0] and "not proof of tampering" in problem["reasons"][0]


@BOTH
def test_a_signed_digest_outranks_a_report_that_front_ran_it(client, cache):
    _, key, true_sha = cache
    now = time.time()
    _post(client, _record("front-runner", [_usage(key, "c" * 64, at=now)], at=now))
    _post(client, _record("writer", [_usage(key, true_sha, at=now + 1, signed=True)], at=now + 1))
    summary = _integrity(client)
    assert key not in {p["key"] for p in summary["problems"]}
    (conflict,) = summary["conflicts"]
    assert conflict["sha256"] == true_sha and conflict["source"] == "signed"
    assert [o["sha256"] for o in conflict["others"]] == ["c" * 64]
    # And against a signed digest, different bytes are proof: tampered.
    _post(client, _record("late", [_usage(key, "b" * 64, at=now + 2, signed=True)], at=now + 2))
    assert key not in {p["key"] for p in _integrity(client)["problems"]}, "a second signed digest is a conflict"


def _swapped(tmp_path: Path, cache_copy: Path) -> tuple[Entry, bytes]:
    by_module: dict[str, Path] = {}
    for path in sorted(cache_copy.glob("*-cache")):
        by_module.setdefault(parse_name(path.name).module, path)
    (_, a), (_, b) = list(by_module.items())[:2]
    name = parse_name(b.name)
    entry = Entry(key=name.key, module=name.module, hash=name.hash, name=b.name, size_bytes=0, mtime_s=0.0)
    return entry, a.read_bytes()


@pytest.mark.parametrize(("platform", "acts"), [("cpu", True), ("gpu", False), (None, False)])
def test_mismatched_acts_only_where_the_check_is_pinned(tmp_path, cache_copy, platform, acts):
    entry, data = _swapped(tmp_path, cache_copy)
    att = attestations.Attestation(entry.key, hashlib.sha256(data).hexdigest(), len(data), "w", source="signed",
                                   platform=platform)
    verdict = integrity.classify(entry, data, att, now=time.time(), min_age_s=0)
    assert integrity.MISMATCHED in verdict.classes
    assert (verdict.classification == integrity.MISMATCHED) is acts
    if not acts:
        assert verdict.classification == integrity.OK and "pinned on CPU entries only" in verdict.reasons[0]


def test_an_unpinned_mismatch_feeds_no_prune(tmp_path, cache_copy):
    from jaxcache.prune import Candidate, PrunePolicy, plan

    entry, data = _swapped(tmp_path, cache_copy)
    att = attestations.Attestation(entry.key, hashlib.sha256(data).hexdigest(), len(data), "w", source="signed",
                                   platform="gpu")
    verdict = integrity.classify(entry, data, att, now=time.time(), min_age_s=0)
    cand = Candidate(key=entry.key, module=entry.module, name=entry.name, size_bytes=1, created_s=0,
                     last_used_s=0, status="ok", integrity=verdict.classification)
    assert plan([cand], PrunePolicy(integrity=("mismatched",), min_age_s=0), now=time.time()).delete == []


def test_file_digests_are_ordered_by_the_storage_clock_not_the_record(tmp_path, cache_copy):
    """Without a service, `doctor --verify` counts the record object written first (its mtime, which storage sets),
    whatever times the records claim; the other is a conflict."""
    import os

    from jaxcache.storage import LocalStorage

    key = sorted(cache_copy.glob("*-cache"))[0].name.removesuffix("-cache")
    shutil.rmtree(cache_copy / ".jaxcache", ignore_errors=True)
    first = _record("first", [_usage(key, "1" * 64, at=time.time())], at=time.time())
    backdated = _record("backdated", [_usage(key, "2" * 64, at=1.0)], at=1.0)
    for rec, mtime in ((first, time.time() - 100), (backdated, time.time())):
        path = cache_copy / rec.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rec.to_json())
        os.utime(path, (mtime, mtime))
    found = attestations.load(LocalStorage(str(cache_copy)))
    assert found.by_key[key].sha256 == "1" * 64
    assert [a.sha256 for a in found.conflicts[key]] == ["2" * 64]
