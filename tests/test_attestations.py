"""Verdicts that mean proof, tried as an attacker would, on SQLite and PostgreSQL: a real job writes entries through
enable_cache() with a signing key (its run record in the bucket, no service URL), then a report-token holder, a
bucket writer or a rogue key tries to make good entries look bad or bad ones look good. With the writers' key
trusted no good entry is ever `tampered` and every altered one is; without it forgeries are `differs` or
conflicts, never `tampered`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from fastapi.testclient import TestClient

from jaxcache import attestations, integrity, records
from jaxcache.entry import parse_name
from jaxcache.records import Fingerprint, KeyUsage, RunRecord
from jaxcache.scan import Entry
from jaxcache.service.app import create_app
from jaxcache.service.reports.records import runfiles
from jaxcache.service.settings import ServiceSettings

JOB = Path(__file__).parent / "programs" / "client_job.py"
ADMIN, REPORT, READ = "a-admin", "a-report", "a-read"
BOTH = pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
SIGNING = pytest.mark.parametrize("signing", [True, False], ids=["signing-on", "signing-off"])
DAY = 86400.0


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_COMPILATION_CACHE"))}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jaxcache", *args], capture_output=True, text=True, timeout=300,
                          env=env or _env())


def _new_key(where: Path, name: str) -> tuple[str, str]:
    proc = _cli("keys", "new", name, "--out", str(where / f"{name}.key"))
    assert proc.returncode == 0, proc.stderr
    return str(where / f"{name}.key"), proc.stdout.strip()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, tuple[str, str], tuple[str, str]]:
    """A cache a real job wrote through enable_cache() with the writers' key; a rogue key beside it."""
    base = tmp_path_factory.mktemp("signed")
    writers, rogue = _new_key(base, "writers"), _new_key(base, "rogue")
    root = base / "cache"
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(root), "--job", "trainer"],
                          capture_output=True, text=True, timeout=300, env=_env(JAXCACHE_SIGNING_KEY=writers[0]))
    assert proc.returncode == 0, proc.stderr
    assert len(list(root.glob("*-sig"))) == len(list(root.glob("*-cache"))) >= 3
    return root, writers, rogue


@pytest.fixture
def cache(tmp_path, written) -> Path:
    """A copy of the written cache whose entries are old enough to be judged (no grace)."""
    dst = tmp_path / "cache"
    shutil.copytree(written[0], dst)
    old = time.time() - 7200
    for p in dst.glob("*-cache"):
        os.utime(p, (old, old))
    return dst


def _service(request, tmp_path: Path, cache: Path, backend: str, trusted: str) -> TestClient:
    db = request.getfixturevalue("pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'c.sqlite'}"
    tokens = {hashlib.sha256(t.encode()).hexdigest(): s for t, s in ((ADMIN, "admin"), (REPORT, "report"),
                                                                       (READ, "read"))}
    # No `with`: the background loops stay off, so only what the test does happens.
    return TestClient(create_app(ServiceSettings(caches={"c": str(cache)}, db=db, tokens=tokens, rescan_s=3600,
                                                 trusted_keys=trusted)))


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _rescan(client: TestClient) -> None:
    # Every record listed, as a process's first rescan does (a back-dated one is otherwise left to the daily one).
    runfiles.listings(client.app.state.jaxcache.catalog).clear()
    assert client.post("/v1/caches/c/rescan", headers=_h(ADMIN)).status_code == 200


def _classes(client: TestClient) -> tuple[dict[str, dict], dict]:
    """Every entry's verdict after a full verify pass, and the integrity summary."""
    assert client.post("/v1/caches/c/verify", json={"recheck_all": True}, headers=_h(ADMIN)).status_code == 200
    summary = client.get("/v1/caches/c/integrity", headers=_h(READ)).json()
    problems = {p["key"]: p for p in summary["problems"]}
    return problems, summary


def _real_record(cache: Path) -> RunRecord:
    (path,) = (cache / records.RUNS_PREFIX).rglob("*.json")
    return records.parse(path.read_bytes())


def _forged(record: RunRecord, digest: str = "f" * 64, *, run_id: str = "forger") -> RunRecord:
    """The real record with every digest replaced and its times moved a day back."""
    keys = [msgspec.structs.replace(u, sha256=digest, first_at=u.first_at - DAY, last_at=u.last_at - DAY)
            for u in record.keys]
    return msgspec.structs.replace(record, run_id=run_id, keys=keys, started_at=record.started_at - DAY,
                                   updated_at=record.updated_at - DAY)


def _keys(cache: Path) -> list[str]:
    return sorted(p.name.removesuffix("-cache") for p in cache.glob("*-cache"))


def _never_tampered(problems: dict[str, dict]) -> None:
    assert not [k for k, p in problems.items() if "tampered" in p["classes"]], problems


@BOTH
@SIGNING
@pytest.mark.parametrize("order", ["after", "before"])
def test_a_report_token_forgery_after_a_real_write_proves_nothing(request, tmp_path, cache, written, backend,
                                                                  signing, order):
    real = _real_record(cache)
    if order == "before":  # the forger front-runs the rescan that reads the real record from the bucket
        hidden = tmp_path / "hidden"
        shutil.move(cache / ".jaxcache", hidden)
    client = _service(request, tmp_path, cache, backend, written[1][1] if signing else "")
    _rescan(client)
    r = client.post("/v1/reports?cache=c", content=_forged(real).to_json(), headers=_h(REPORT))
    assert r.status_code == 202, r.text
    if order == "before":
        _rescan(client)
        shutil.move(hidden, cache / ".jaxcache")
    _rescan(client)
    problems, summary = _classes(client)
    _never_tampered(problems)
    if signing:  # the signed digests count: every entry is ok, the forged ones are only conflicts
        assert problems == {} and summary["counts"]["ok"] == len(_keys(cache))
    else:  # unsigned digests disagree: a conflict on every entry, and `differs` where the forged one came first
        assert {c["key"] for c in summary["conflicts"]} == set(_keys(cache))
        key = _keys(cache)[0]  # and on the entry itself, in the API and on its page
        shown = client.get(f"/v1/caches/c/entries/{key}", headers=_h(READ)).json()["conflict"]
        digests = [shown["sha256"], *(o["sha256"] for o in shown["others"])]
        assert shown["key"] == key and len(digests) == 2 and "f" * 64 in digests, shown  # which counts: the first
        assert "f" * 16 in client.get(f"/caches/c/entries/{key}", headers=_h(READ)).text
        assert {p["class"] for p in problems.values()} <= {"differs"}
        assert not any(p["held_up"] for p in problems.values()) and summary["held_up"] == 0
        assert bool(problems) is (order == "before")
        for p in problems.values():
            assert "reported to the service" in p["reasons"][0] and "not proof" in p["reasons"][0]
        # The shipped policy acts only on proof; `differs` is pruned only where the operator names it.
        planned = {}
        for classes in (["tampered", "corrupt"], ["differs"]):
            r = client.post("/v1/caches/c/prune", json={"integrity": classes, "min_age": "0s"}, headers=_h(ADMIN))
            assert r.status_code == 200, r.text
            planned[classes[0]] = {d["key"] for d in r.json()["delete"]}
        assert planned == {"tampered": set(), "differs": set(problems)}, planned


@BOTH
@SIGNING
def test_a_forged_record_file_proves_nothing(request, tmp_path, cache, written, backend, signing):
    forged = _forged(_real_record(cache), "e" * 64, run_id="in-bucket")
    (cache / forged.name).parent.mkdir(parents=True, exist_ok=True)
    (cache / forged.name).write_bytes(forged.to_json())
    os.utime(cache / forged.name, (1.0, 1.0))  # read first: the storage clock says it is the oldest record
    client = _service(request, tmp_path, cache, backend, written[1][1] if signing else "")
    _rescan(client)
    problems, _ = _classes(client)
    _never_tampered(problems)
    if signing:
        assert problems == {}
    else:
        assert problems and all(p["class"] == "differs" and forged.name in p["reasons"][0]
                                for p in problems.values())


def _plant(cache: Path) -> tuple[str, str]:
    """Copy the entry of g over the entry of f (bucket write access), with a record vouching for it."""
    f, g = _keys(cache)[:2]
    shutil.copyfile(cache / f"{g}-cache", cache / f"{f}-cache")
    os.utime(cache / f"{f}-cache", (time.time() - 7200,) * 2)
    sha = hashlib.sha256((cache / f"{f}-cache").read_bytes()).hexdigest()
    usage = KeyUsage(key=f, event=records.WRITE, writes=1, compiles=1, sha256=sha, first_at=1.0)
    record = RunRecord(job="planter", run_id="planted", process_index=0, process_count=1, host="h", started_at=1.0,
                       updated_at=1.0, fingerprint=Fingerprint(jax="0", jaxlib="0", backend="cpu"), keys=[usage])
    (cache / record.name).parent.mkdir(parents=True, exist_ok=True)
    (cache / record.name).write_bytes(record.to_json())
    os.utime(cache / record.name, (1.0, 1.0))
    return f, g


@BOTH
@SIGNING
def test_a_planted_entry_with_a_matching_forged_record(request, tmp_path, cache, written, backend, signing):
    f, _ = _plant(cache)
    client = _service(request, tmp_path, cache, backend, written[1][1] if signing else "")
    _rescan(client)
    problems, _ = _classes(client)
    if signing:  # the writer's signature of f's bytes: proof
        assert set(problems) == {f} and problems[f]["class"] == "tampered"
        assert "trusted key 'writers'" in problems[f]["reasons"][0]
    else:  # the forged record counts (read first); only the embedded name, pinned on CPU, gives it away
        _never_tampered(problems)
        assert problems[f]["class"] == "mismatched"


@BOTH
def test_a_digest_signed_by_an_untrusted_key_rescues_nothing(request, tmp_path, cache, written, backend):
    victim = cache / f"{_keys(cache)[0]}-cache"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    os.utime(victim, (time.time() - 7200,) * 2)
    proc = _cli("keys", "sign", str(cache), "--key", written[2][0])  # the rogue key signs the altered bytes
    assert proc.returncode == 0, proc.stderr
    client = _service(request, tmp_path, cache, backend, written[1][1])
    _rescan(client)
    problems, _ = _classes(client)
    key = victim.name.removesuffix("-cache")
    assert set(problems) == {key} and problems[key]["class"] == "tampered"
    assert any("'rogue', which is not a trusted key" in r for r in problems[key]["reasons"])


@BOTH
def test_a_signature_moved_to_another_key_verifies_nothing(request, tmp_path, cache, written, backend):
    f, g = _keys(cache)[:2]
    shutil.copyfile(cache / f"{f}-sig", cache / f"{g}-sig")  # g's entry is untouched; its signature is f's now
    h = _keys(cache)[2]
    shutil.copyfile(cache / f"{f}-cache", cache / f"{h}-cache")  # h gets f's bytes and f's signature
    shutil.copyfile(cache / f"{f}-sig", cache / f"{h}-sig")
    os.utime(cache / f"{h}-cache", (time.time() - 7200,) * 2)
    client = _service(request, tmp_path, cache, backend, written[1][1])
    _rescan(client)
    problems, summary = _classes(client)
    # A good entry is never tampered: its class is what its bytes prove, the moved signature named beside it (#58).
    assert (problems[g]["class"], problems[g]["signature"]) == ("ok", "bad signature"), problems[g]
    assert h in problems and "tampered" not in problems[h]["classes"]
    assert problems[h]["class"] == "mismatched" and any("another key" in r for r in problems[h]["reasons"])


@BOTH
@SIGNING
def test_a_truncated_entry_is_proven_bad(request, tmp_path, cache, written, backend, signing):
    victim = cache / f"{_keys(cache)[-1]}-cache"
    victim.write_bytes(victim.read_bytes()[:-7])
    os.utime(victim, (time.time() - 7200,) * 2)
    client = _service(request, tmp_path, cache, backend, written[1][1] if signing else "")
    _rescan(client)
    problems, _ = _classes(client)
    key = victim.name.removesuffix("-cache")
    assert set(problems) == {key}
    assert problems[key]["class"] == ("tampered" if signing else "corrupt") and problems[key]["held_up"]
    # The shipped policy removes it, and its signature with it: the key can be written again.
    r = client.post("/v1/caches/c/prune", json={"integrity": ["tampered", "corrupt"], "dry_run": False,
                                                "min_age": "0s"}, headers=_h(ADMIN))
    assert r.status_code == 200, r.text
    assert not victim.exists() and not (cache / f"{key}-sig").exists()
    assert len(list(cache.glob("*-sig"))) == len(list(cache.glob("*-cache")))


def test_rotation_re_signs_what_the_old_key_signed_and_retiring_it_unsigns_the_rest(tmp_path, cache, written):
    new = _new_key(tmp_path, "writers-2")
    old_pub = written[1][1]
    victim = cache / f"{_keys(cache)[0]}-cache"
    victim.write_bytes(victim.read_bytes()[:-3] + b"\0\0\0")
    os.utime(victim, (time.time() - 7200,) * 2)
    both = _env(JAXCACHE_TRUSTED_KEYS=f"{old_pub} {new[1]}")
    proc = _cli("keys", "sign", str(cache), "--key", new[0], "--if-signed-by", "writers", "--json", env=both)
    assert proc.returncode == 1, proc.stderr  # a tampered entry was found and not re-signed
    out = json.loads(proc.stdout)
    key = victim.name.removesuffix("-cache")
    assert set(out["signed"]) == set(_keys(cache)) - {key}
    assert [s["key"] for s in out["skipped"]] == [key] and "tampered" in out["skipped"][0]["why"]
    # The old key retired: its entries are unsigned, nothing else; the re-signed ones are ok under the new key.
    proc = _cli("doctor", str(cache), "--verify", "--json", env=_env(JAXCACHE_TRUSTED_KEYS=new[1]))
    report = {e["key"]: e for e in json.loads(proc.stdout)["entries"]}
    assert all(report[k]["class"] == "ok" for k in out["signed"])
    assert report[key]["class"] != "tampered"
    # An untrusted --if-signed-by is refused, one line, nothing written.
    bad = _cli("keys", "sign", str(cache), "--key", new[0], "--if-signed-by", "nobody", env=both)
    assert bad.returncode == 2 and "not in JAXCACHE_TRUSTED_KEYS" in bad.stderr


def test_a_record_from_an_older_client_keeps_its_digest_and_its_hmac_field_is_ignored(cache):
    record = json.loads(_real_record(cache).to_json())
    record["keys"][0]["signature"] = "0" * 64  # the retired HMAC an older client wrote
    parsed = records.parse(json.dumps(record).encode())
    (att, *_) = attestations.from_run(parsed, source=attestations.FILE, at=1.0)
    assert att.sha256 == record["keys"][0]["sha256"] and not att.proof


def _swapped(cache_copy: Path) -> tuple[Entry, bytes]:
    by_module: dict[str, Path] = {}
    for path in sorted(cache_copy.glob("*-cache")):
        by_module.setdefault(parse_name(path.name).module, path)
    (_, a), (_, b) = list(by_module.items())[:2]
    name = parse_name(b.name)
    entry = Entry(key=name.key, module=name.module, hash=name.hash, name=b.name, size_bytes=0, mtime_s=0.0)
    return entry, a.read_bytes()


@pytest.mark.parametrize(("platform", "acts"), [("cpu", True), ("gpu", False), (None, False)])
def test_mismatched_acts_only_where_the_check_is_pinned(cache_copy, platform, acts):
    entry, data = _swapped(cache_copy)
    att = attestations.Attestation(entry.key, hashlib.sha256(data).hexdigest(), len(data), "w",
                                   source="reported", platform=platform)
    verdict = integrity.classify(entry, data, att, now=time.time(), min_age_s=0)
    assert integrity.MISMATCHED in verdict.classes
    assert (verdict.classification == integrity.MISMATCHED) is acts
    if not acts:
        assert verdict.classification == integrity.OK and "pinned on CPU entries only" in verdict.reasons[0]


def test_an_unpinned_mismatch_feeds_no_prune(cache_copy):
    from jaxcache.prune import Candidate, PrunePolicy, plan

    entry, data = _swapped(cache_copy)
    att = attestations.Attestation(entry.key, hashlib.sha256(data).hexdigest(), len(data), "w",
                                   source="reported", platform="gpu")
    verdict = integrity.classify(entry, data, att, now=time.time(), min_age_s=0)
    cand = Candidate(key=entry.key, module=entry.module, name=entry.name, size_bytes=1, created_s=0,
                     last_used_s=0, status="ok", integrity=verdict.classification)
    assert plan([cand], PrunePolicy(integrity=("mismatched",), min_age_s=0), now=time.time()).delete == []


def test_file_digests_are_ordered_by_the_storage_clock_not_the_record(cache_copy):
    """Without a service, `doctor --verify` counts the record object written first (its mtime, which storage sets),
    whatever times the records claim; the other is a conflict."""
    from jaxcache.storage import LocalStorage

    key = sorted(cache_copy.glob("*-cache"))[0].name.removesuffix("-cache")
    shutil.rmtree(cache_copy / ".jaxcache", ignore_errors=True)
    usage = lambda sha, at: KeyUsage(key=key, event=records.WRITE, writes=1, compiles=1, sha256=sha,  # noqa: E731
                                     first_at=at)
    fp = Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="cpu")
    first = RunRecord(job="j", run_id="first", process_index=0, process_count=1, host="h", started_at=time.time(),
                      updated_at=time.time(), fingerprint=fp, keys=[usage("1" * 64, time.time())])
    backdated = RunRecord(job="j", run_id="backdated", process_index=0, process_count=1, host="h", started_at=1.0,
                          updated_at=1.0, fingerprint=fp, keys=[usage("2" * 64, 1.0)])
    for rec, mtime in ((first, time.time() - 100), (backdated, time.time())):
        path = cache_copy / rec.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rec.to_json())
        os.utime(path, (mtime, mtime))
    found = attestations.load(LocalStorage(str(cache_copy)))
    assert found.by_key[key].sha256 == "1" * 64
    assert [a.sha256 for a in found.conflicts[key]] == ["2" * 64]


@BOTH
def test_a_key_removed_from_the_trusted_list_has_its_verdicts_made_again(request, tmp_path, cache, written, backend):
    """Verdicts remember the trusted keys they were made under: a service started without the key judges again
    at its next pass (no recheck asked), and what the key proved is proof no more."""
    keys = _keys(cache)
    victim = cache / f"{keys[0]}-cache"
    victim.write_bytes((cache / f"{keys[1]}-cache").read_bytes())  # another program's bytes
    os.utime(victim, (time.time() - 7200,) * 2)
    client = _service(request, tmp_path, cache, backend, written[1][1])
    _rescan(client)
    problems, _ = _classes(client)
    assert problems[keys[0]]["class"] == "tampered"
    retired = _service(request, tmp_path, cache, backend, "")  # the same catalog, the key no longer trusted
    assert retired.post("/v1/caches/c/verify", json={}, headers=_h(ADMIN)).status_code == 200
    problems = {p["key"]: p for p in retired.get("/v1/caches/c/integrity", headers=_h(READ)).json()["problems"]}
    _never_tampered(problems)
    assert "differs" in problems[keys[0]]["classes"], problems[keys[0]]  # against the writer's unsigned digest
