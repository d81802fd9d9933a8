"""The service's integrity pass over real JAX entries, on a local root and on fake-gcs-server."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache import signing
from jaxcache.entry import parse_name
from jaxcache.records import WRITE, KeyUsage
from jaxcache.service.app import create_app
from jaxcache.service.settings import ServiceSettings
from reports_support import put_record, run
from store_servers import put_dir, raw_names

JOB = Path(__file__).parent / "programs" / "client_job.py"
ADMIN, REPORT, READ = "i-admin", "i-report", "i-read"
# The writer signs what JAX puts and the service trusts the key: a mismatch against its signature is tampering.
KEY_PATH = str(Path(tempfile.mkdtemp(prefix="jaxcache-i-")) / "writers.key")
PUBLIC = signing.new_key("writers", KEY_PATH).public_text()
BAD = ["tampered", "mismatched", "corrupt"]


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, jax_caches) -> dict:
    """A signed cache (written through jaxcache.client) with one entry of each kind of damage, plus one
    entry written by plain JAX. Returns the root and which keys are which."""
    root = tmp_path_factory.mktemp("integrity") / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(root), "--job", "writer"],
                          capture_output=True, text=True, timeout=300,
                          env={**env, "JAX_PLATFORMS": "cpu", "JAXCACHE_SIGNING_KEY": KEY_PATH})
    assert proc.returncode == 0, proc.stderr
    by_module: dict[str, Path] = {}
    for path in sorted(root.glob("*-cache")):
        by_module.setdefault(parse_name(path.name).module, path)
    paths = sorted(by_module.values())
    flipped, swapped_from, swapped_to, truncated = paths[0], paths[1], paths[2], paths[3]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    shutil.copyfile(swapped_from, swapped_to)
    truncated.write_bytes(truncated.read_bytes()[:40])
    plain = next(Path(jax_caches["zstd"].root).glob("jit_train_step-*-cache"))
    shutil.copyfile(plain, root / plain.name)
    old = time.time() - 7200
    for path in root.glob("*-cache"):
        os.utime(path, (old, old))
    key = lambda p: p.name.removesuffix("-cache")  # noqa: E731
    return {"root": root, "flipped": key(flipped), "swapped": key(swapped_to), "truncated": key(truncated),
            "plain": key(plain), "all": {key(p) for p in root.glob("*-cache")}}


def _app(url: str, tmp_path: Path, **settings) -> TestClient:
    tokens = {hashlib.sha256(t.encode()).hexdigest(): s for t, s in ((ADMIN, "admin"), (REPORT, "report"),
                                                                       (READ, "read"))}
    return TestClient(create_app(ServiceSettings(
        caches={"c": url}, db=f"sqlite:///{tmp_path / 'catalog.sqlite'}", tokens=tokens,
        **{"trusted_keys": PUBLIC, **settings})))


def _rescanned(client: TestClient) -> None:
    # After the first background round: a rescan POSTed while it runs waits for it, or under load answers busy.
    settled(client)
    r = client.post("/v1/caches/c/rescan", headers=_headers(ADMIN))
    assert r.status_code == 200, r.text


def _expect_verdicts(client: TestClient, d: dict, signed_badly: frozenset[str] | set[str] = frozenset()) -> dict:
    # recheck_all: the background pass may have judged them already; this one must read every entry.
    verify = client.post("/v1/caches/c/verify", json={"recheck_all": True}, headers=_headers(ADMIN))
    assert verify.status_code == 200, verify.text
    assert verify.json()["checked"] == len(d["all"]) and verify.json()["remaining"] == 0
    summary = client.get("/v1/caches/c/integrity", headers=_headers(READ)).json()
    problems = {p["key"]: p for p in summary["problems"]}
    assert problems[d["flipped"]]["class"] == "tampered"
    assert problems[d["swapped"]]["classes"][:2] == ["tampered", "mismatched"]
    assert "corrupt" in problems[d["truncated"]]["classes"]
    assert set(problems) == {d["flipped"], d["swapped"], d["truncated"], *signed_badly}
    # An entry beside a bad signature is listed by it, its class what its bytes prove (#58 item 7).
    assert {k: (p["class"], p["signature"]) for k, p in problems.items() if p["signature"]} == {
        k: ("ok", "bad signature") for k in signed_badly}
    counts = summary["counts"]
    assert counts["unattested"] == 1 and counts["ok"] == len(d["all"]) - 4
    assert summary["attested"] == len(d["all"]) - 1 and summary["unverified"] == 0
    return summary


def _prune_bad(client: TestClient, d: dict) -> None:
    policy = {"integrity": BAD, "min_age": 0}
    dry = client.post("/v1/caches/c/prune", json=policy, headers=_headers(ADMIN))
    assert dry.status_code == 200, dry.text
    planned = {e["key"] for e in dry.json()["delete"]}
    assert planned == {d["flipped"], d["swapped"], d["truncated"]}
    assert client.post("/v1/caches/c/prune", json={**policy, "dry_run": False},
                       headers=_headers(READ)).status_code == 403
    applied = client.post("/v1/caches/c/prune", json={**policy, "dry_run": False}, headers=_headers(ADMIN))
    assert applied.status_code == 200, applied.text


def test_integrity_pass_classifies_and_prune_removes_exactly_the_bad_ones_locally(damaged, tmp_path):
    root = tmp_path / "cache"
    shutil.copytree(damaged["root"], root)
    with _app(str(root), tmp_path) as client:
        _rescanned(client)
        _expect_verdicts(client, damaged)

        detail = client.get(f"/v1/caches/c/entries/{damaged['swapped']}", headers=_headers(READ)).json()
        assert detail["integrity"] == "tampered" and detail["attested_by"].startswith("job writer")
        assert any("bytes of another program" in r for r in detail["integrity_reasons"])
        plain = client.get(f"/v1/caches/c/entries/{damaged['plain']}", headers=_headers(READ)).json()
        assert plain["integrity"] == "unattested"

        # What a job with verify="attested" asks, with its report token, by its own spelling of the root.
        by_dir = client.get("/v1/integrity", params={"cache_dir": str(root) + "/"}, headers=_headers(REPORT))
        assert by_dir.status_code == 200 and by_dir.json()["counts"]["tampered"] == 3  # the truncated one too
        assert client.post("/v1/caches/c/verify", headers=_headers(READ)).status_code == 403

        metrics = client.get("/metrics").text
        assert 'jaxcache_integrity_entries{cache="c",class="tampered"} 3.0' in metrics

        _prune_bad(client, damaged)
        left = {p.name.removesuffix("-cache") for p in root.glob("*-cache")}
        assert left == damaged["all"] - {damaged["flipped"], damaged["swapped"], damaged["truncated"]}

        again = client.post("/v1/caches/c/verify", json={"recheck_all": True}, headers=_headers(ADMIN)).json()
        assert set(again["counts"]) <= {"ok", "unattested"}


def test_digests_by_dir_are_the_ones_entries_are_judged_against(damaged, tmp_path):
    root = tmp_path / "cache"
    shutil.copytree(damaged["root"], root)
    bad = {damaged["flipped"], damaged["swapped"], damaged["truncated"]}
    good = sorted(damaged["all"] - bad - {damaged["plain"]})[0]
    nowhere = f"jit_nowhere-{'0' * 64}"
    url = "/v1/integrity/digests"
    with _app(str(root), tmp_path) as client:
        _rescanned(client)
        ask = lambda keys, **body: client.post(  # noqa: E731 - what verify="attested" asks, with its report token
            url, json={"cache_dir": str(root) + "/", "keys": keys, **body}, headers=_headers(REPORT))
        r = ask([good, damaged["flipped"], damaged["plain"], nowhere])
        assert r.status_code == 200, r.text
        digests = r.json()["digests"]
        assert set(digests) == {good, damaged["flipped"]}  # plain JAX wrote no digest; nothing wrote `nowhere`
        held = (root / f"{good}-cache").read_bytes()
        assert digests[good] == {"sha256": hashlib.sha256(held).hexdigest(), "size_bytes": len(held),
                                 "writer": digests[good]["writer"]} and digests[good]["writer"].startswith("job writer")
        flipped = (root / f"{damaged['flipped']}-cache").read_bytes()
        assert digests[damaged["flipped"]]["sha256"] != hashlib.sha256(flipped).hexdigest()  # its writer's, not these
        assert r.json()["conflicts"] == [] and ask([]).json()["digests"] == {}

        # A later writer's other digest for `good`: the first still counts, and the answer names the conflict.
        other = KeyUsage(key=good, event=WRITE, compiles=1, writes=1, compile_s=1.0, first_at=time.time(),
                         last_at=time.time(), sha256="f" * 64, size_bytes=len(held))
        put_record(root, run("other", "r2", [other], cache_dir=str(root)))
        _rescanned(client)
        answer = ask([good]).json()
        assert answer["digests"][good]["sha256"] == hashlib.sha256(held).hexdigest()
        ((conflict,),) = [answer["conflicts"]]
        assert conflict["key"] == good and [o["sha256"] for o in conflict["others"]] == ["f" * 64]

        # Typed strictly, bounded, and by a root the service serves.
        for keys in (["not-a-key"], [f"a/b-{'0' * 64}"], [1], good, [f"{good}\n"]):
            assert ask(keys).status_code == 422, keys
        assert ask([good], extra=1).status_code == 422
        assert client.post(url, json={"keys": [good]}, headers=_headers(REPORT)).status_code == 422
        assert ask([nowhere] * 1000).status_code == 413  # over JAXCACHE_MAX_BODY_BYTES
        elsewhere = client.post(url, json={"cache_dir": str(tmp_path), "keys": [good]}, headers=_headers(REPORT))
        assert elsewhere.status_code == 404 and "no configured cache has the root" in elsewhere.text
        assert client.post(url, json={"cache_dir": str(root), "keys": [good]}).status_code == 401
        documented = client.get("/openapi.json").json()["paths"][url]["post"]
        assert {"404", "413", "422"} <= set(documented["responses"]), documented["responses"]
    with _app(str(root), tmp_path, max_body_bytes=10**7) as client:  # a body that holds more keys than a request may
        r = client.post(url, json={"cache_dir": str(root), "keys": [nowhere] * 10_001}, headers=_headers(READ))
        assert r.status_code == 422 and "at most 10000 a request" in r.text, r.text[:300]


def test_fresh_damage_is_pending_not_corrupt(damaged, tmp_path):
    root = tmp_path / "cache"
    shutil.copytree(damaged["root"], root)
    victim = root / f"{damaged['truncated']}-cache"
    os.utime(victim)  # written just now: JAX may still be writing it
    with _app(str(root), tmp_path) as client:
        _rescanned(client)
        client.post("/v1/caches/c/verify", json={"recheck_all": True}, headers=_headers(ADMIN))
        summary = client.get("/v1/caches/c/integrity", headers=_headers(READ)).json()
        (p,) = [p for p in summary["problems"] if p["key"] == damaged["truncated"]]
        assert p["class"] == "pending"
        dry = client.post("/v1/caches/c/prune", json={"integrity": BAD}, headers=_headers(ADMIN)).json()
        assert damaged["truncated"] not in {e["key"] for e in dry["delete"]}


def test_integrity_prune_in_an_object_store(damaged, store_root, tmp_path):
    put_dir(store_root, damaged["root"])
    # Objects on the test's server are as old as the upload: no grace period, so nothing is pending.
    with _app(store_root, tmp_path, verify_min_age_s=0) as client:
        _rescanned(client)
        _expect_verdicts(client, damaged)
        _prune_bad(client, damaged)
    left = {name.removesuffix("-cache") for name in raw_names(store_root) if name.endswith("-cache")}
    assert left == damaged["all"] - {damaged["flipped"], damaged["swapped"], damaged["truncated"]}


def test_policy_integrity_rejects_classes_that_prove_nothing(tmp_path, damaged):
    with _app(str(damaged["root"]), tmp_path) as client:
        for bad in (["unattested"], ["pending"], "tampered,corrupt", [1]):
            r = client.post("/v1/caches/c/prune", json={"integrity": bad}, headers=_headers(ADMIN))
            assert r.status_code in (400, 422), (bad, r.text)
        assert json.loads(client.get("/openapi.json").text)["paths"]["/v1/caches/{cache}/verify"]
