"""Integrity: signatures and digests of the bytes JAX put, embedded module names, and the classes doctor --verify
gives: `tampered` only against a trusted signature, `differs` against an unsigned digest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import shared_fixture_dirs
from jaxcache import coverage, integrity, records, signing
from jaxcache.entry import parse_name, validate
from jaxcache.records import Fingerprint, KeyUsage, RunRecord
from jaxcache.scan import Entry, scan
from jaxcache.storage import LocalStorage

JOB = Path(__file__).parent / "programs" / "client_job.py"
HOUR = 3600.0


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_COMPILATION_CACHE"))}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def age(path: Path, seconds: float = 2 * HOUR) -> None:
    """Make a file look written ``seconds`` ago (older than the grace period)."""
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> tuple[str, str]:
    """A signing key made as an operator makes one: ``(private key file, public key NAME:base64)``."""
    path = tmp_path_factory.mktemp("keys") / "writers.key"
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "keys", "new", "writers", "--out", str(path)],
                          capture_output=True, text=True, timeout=60, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert oct(path.stat().st_mode & 0o777) == "0o600" and str(path) in proc.stderr
    return str(path), proc.stdout.strip()


def verdicts(root: Path, trusted: str = "", min_age_s: float = HOUR) -> dict[str, integrity.Verdict]:
    storage = LocalStorage(str(root))
    entries = [r for r in scan(storage, read_headers=False) if isinstance(r, Entry)]
    found = integrity.load_attestations(storage)
    return {v.key: v for v in integrity.verify(storage, entries, found, now=time.time(), min_age_s=min_age_s,
                                               trusted=signing.TrustedKeys.parse(trusted))}


def attest_by_hand(root: Path, job: str = "hand") -> None:
    """A run record with digests of the entries as they are now, as a client writer (on CPU) would have recorded."""
    keys = []
    for path in sorted(root.glob("*-cache")):
        data = path.read_bytes()
        name = parse_name(path.name)
        sha = integrity.sha256_hex(data)
        keys.append(KeyUsage(key=name.key, event=records.WRITE, function=name.module, writes=1,
                             size_bytes=len(data), sha256=sha, first_at=1.0))
    run = RunRecord(job=job, run_id="hand-1", process_index=0, process_count=1, host="h", started_at=1.0,
                    updated_at=1.0, fingerprint=Fingerprint(jax="0", jaxlib="0", backend="cpu"), keys=keys)
    (root / run.name).parent.mkdir(parents=True, exist_ok=True)
    (root / run.name).write_bytes(run.to_json())


@pytest.fixture(scope="module")
def attested_cache(tmp_path_factory, key) -> Path:
    """A zstd cache written through jaxcache.client with a signing key: every entry attested and signed."""
    root = tmp_path_factory.mktemp("attested") / "cache"
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(root), "--job", "writer"],
                          capture_output=True, text=True, timeout=300, env=clean_env(JAXCACHE_SIGNING_KEY=key[0]))
    assert proc.returncode == 0, proc.stderr
    for path in root.glob("*-cache"):
        age(path)
    return root


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for path in dst.glob("*-cache"):
        age(path)
    return dst


# --- the embedded module name ------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", shared_fixture_dirs(), ids=lambda p: p.name)
def test_embedded_module_matches_jax_ground_truth(fixture):
    manifest = json.loads((fixture / "manifest.json").read_text())
    storage = LocalStorage(str(fixture / "cache"))
    for item in manifest["entries"]:
        data = storage.read(item["file"])
        head = validate(data).head
        assert integrity.embedded_module(head) == item["module"], item["file"]


def test_embedded_module_in_this_jax_zlib_and_zstd(jax_caches):
    for written in jax_caches.values():
        for item in written.entries:
            data = Path(written.root, item["file"]).read_bytes()
            assert integrity.embedded_module(validate(data).head) == item["module"]


def test_embedded_module_of_garbage_is_unknown():
    assert integrity.embedded_module(b"") is None
    assert integrity.embedded_module(b"\0\0\0\0\xff\xff\xff") is None


# --- classes -----------------------------------------------------------------------------------------------


def test_client_writes_attested_signed_entries_and_a_clean_cache_is_all_ok(attested_cache, key):
    found = integrity.load_attestations(LocalStorage(str(attested_cache)))
    assert found and all(a.writer.startswith("job writer") for a in found.values())
    assert {p.name.removesuffix("-sig") for p in attested_cache.glob("*-sig")} == set(found)
    for trusted in (key[1], ""):
        result = verdicts(attested_cache, trusted)
        assert result and all(v.classification == integrity.OK for v in result.values()), result


def test_the_signature_is_of_the_bytes_jax_put_not_of_a_read_back(attested_cache, key):
    """Each ``-sig`` signs the digest and size of what JAX stored, by the key's name; nothing else verifies."""
    trusted = signing.TrustedKeys.parse(key[1])
    for path in attested_cache.glob("*-cache"):
        k = path.name.removesuffix("-cache")
        (sig,) = signing.read(LocalStorage(str(attested_cache)), k, trusted).trusted
        assert (sig.sha256, sig.size_bytes, sig.signer) == (integrity.sha256_hex(path.read_bytes()),
                                                              path.stat().st_size, "writers")
        assert sig.writer and sig.writer.startswith("job writer run")
        assert trusted.check(signing.Signature(k, sig.sha256, sig.size_bytes + 1, sig.signer, sig.signature), k)


def test_flipped_byte_in_a_signed_zstd_entry_is_tampered_and_only_differs_unsigned(attested_cache, key, tmp_path):
    root = copy_of(attested_cache, tmp_path / "c")
    victim = max(root.glob("*-cache"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    age(victim)
    result = verdicts(root, key[1])
    name = victim.name.removesuffix("-cache")
    assert result[name].classification == integrity.TAMPERED, result[name]
    assert "trusted key 'writers'" in result[name].reasons[0]
    assert all(v.classification == integrity.OK for k, v in result.items() if k != name)
    # Without a trusted key the signature proves nothing: the record's digest is unsigned, so `differs`.
    unsigned = verdicts(root)[name]
    assert unsigned.classification == integrity.DIFFERS and "not proof of tampering" in unsigned.reasons[0]


def test_bytes_copied_between_functions_are_tampered_and_mismatched(attested_cache, key, tmp_path):
    root = copy_of(attested_cache, tmp_path / "c")
    by_module: dict[str, Path] = {}
    for path in sorted(root.glob("*-cache")):
        by_module.setdefault(parse_name(path.name).module, path)
    (a, pa), (b, pb) = list(by_module.items())[:2]
    shutil.copyfile(pa, pb)
    age(pb)
    verdict = verdicts(root, key[1])[pb.name.removesuffix("-cache")]
    assert verdict.classes[:2] == (integrity.TAMPERED, integrity.MISMATCHED), verdict
    assert verdict.embedded_module == a and any(a in r for r in verdict.reasons)


def test_swapped_bytes_without_a_record_are_flagged_but_not_acted_on(jax_caches, tmp_path):
    """The embedded-name check is pinned on CPU entries only: without a record nothing says an entry is CPU's, so a
    mismatch is listed and explained, but the class that jobs and prunes act on stays unattested."""
    for flavour in ("zstd", "zlib"):
        root = copy_of(Path(jax_caches[flavour].root), tmp_path / flavour)
        shutil.rmtree(root / ".jaxcache", ignore_errors=True)
        by_module: dict[str, Path] = {}
        for path in sorted(root.glob("*-cache")):
            by_module.setdefault(parse_name(path.name).module, path)
        paths = list(by_module.values())
        shutil.copyfile(paths[0], paths[1])
        age(paths[1])
        result = verdicts(root)
        swapped = result[paths[1].name.removesuffix("-cache")]
        assert swapped.classification == integrity.UNATTESTED and integrity.MISMATCHED in swapped.classes
        assert "not acted on by itself" in swapped.reasons[0] and "unknown" in swapped.reasons[0]
        others = [v for k, v in result.items() if k != paths[1].name.removesuffix("-cache")]
        assert all(v.classification == integrity.UNATTESTED for v in others), "plain JAX entries are unattested"


def test_zlib_signed_flip_is_tampered_and_corrupt(jax_caches, key, tmp_path):
    root = copy_of(Path(jax_caches["zlib"].root), tmp_path / "zlib")
    attest_by_hand(root)
    # Changed after its writer recorded it, before the rollout signs: --if-recorded leaves it unsigned.
    planted = min(root.glob("*-cache"), key=lambda p: p.stat().st_size)
    planted.write_bytes(planted.read_bytes() + b"\0")
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "keys", "sign", str(root), "--key", key[0],
                           "--if-recorded"], capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0 and "signed" in proc.stdout, proc.stderr
    planted_key = planted.name.removesuffix("-cache")
    assert f"skipped {planted_key}: differs from its recorded digest" in proc.stdout, proc.stdout
    assert not (root / signing.sig_name(planted_key)).exists()
    victim = max(root.glob("*-cache"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    age(victim)
    verdict = verdicts(root, key[1])[victim.name.removesuffix("-cache")]
    assert verdict.classes == (integrity.TAMPERED, integrity.CORRUPT), verdict  # zlib's adler32 catches it too


def test_truncated_old_entry_is_corrupt_and_a_fresh_one_pending(jax_caches, tmp_path):
    root = copy_of(Path(jax_caches["zstd"].root), tmp_path / "c")
    old, fresh = sorted(root.glob("*-cache"), key=lambda p: p.stat().st_size)[-2:]
    for path in (old, fresh):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    age(old)
    result = verdicts(root)
    assert result[old.name.removesuffix("-cache")].classification == integrity.CORRUPT
    pending = result[fresh.name.removesuffix("-cache")]
    assert pending.classification == integrity.PENDING and "may still be being written" in pending.reasons[0]


def test_warmup_coverage_attests_and_signs_what_it_wrote(tmp_path, key):
    root = tmp_path / "c"
    proc = subprocess.run([sys.executable, "-m", "jaxcache.warmup", "--topology", "1x1x2", "--platform", "cpu",
                           "--cache-dir", str(root), "--entrypoint", "jaxcache.warmup.examples:warm", "--json"],
                          capture_output=True, text=True, timeout=300, env=clean_env(JAXCACHE_SIGNING_KEY=key[0]))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    record = coverage.parse((root / summary["coverage_record"]).read_bytes())
    assert record.programs and all(p.sha256 for p in record.programs if p.status == coverage.WRITTEN)
    found = integrity.load_attestations(LocalStorage(str(root)))
    assert {p.key for p in record.programs} <= set(found)
    assert any(a.writer == f"warm-up {record.id}" for a in found.values())
    written = {p.key for p in record.programs if p.status == coverage.WRITTEN}
    assert written and {p.name.removesuffix("-sig") for p in root.glob("*-sig")} == written
    result = verdicts(root, key[1], min_age_s=0)
    assert all(result[k].classification == integrity.OK for k in written), result
    trusted = signing.TrustedKeys.parse(key[1])
    assert all(signing.read(LocalStorage(str(root)), k, trusted).trusted for k in written)


# --- doctor --verify --------------------------------------------------------------------------------------


def test_doctor_verify_exit_codes_and_json(attested_cache, key, tmp_path):
    cli = [sys.executable, "-m", "jaxcache", "doctor"]
    env = clean_env(JAXCACHE_TRUSTED_KEYS=key[1])
    proc = subprocess.run([*cli, str(attested_cache), "--verify", "--json"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["counts"]["ok"] == report["checked"] > 0 and not report["problems"]

    root = copy_of(attested_cache, tmp_path / "c")
    victim = next(root.glob("*-cache"))
    victim.write_bytes(victim.read_bytes()[:-7])
    age(victim)
    proc = subprocess.run([*cli, str(root), "--verify"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1 and "tampered" in proc.stdout and victim.name in proc.stdout, proc.stdout
    # Without a trusted key the records are files anyone who can write the bucket could have written: the digest
    # only differs, and what proves the entry bad is that it is torn (`corrupt`, listed first).
    proc = subprocess.run([*cli, str(root), "--verify"], capture_output=True, text=True, timeout=120, env=clean_env())
    first = proc.stdout.splitlines()[0]
    assert proc.returncode == 1 and "1 corrupt" in first and "tampered" not in first, proc.stdout
    assert "not proof of tampering" in proc.stdout


def test_cli_prune_integrity_deletes_exactly_the_bad_ones_with_their_signatures(attested_cache, key, tmp_path):
    root = copy_of(attested_cache, tmp_path / "c")
    victims = sorted(root.glob("*-cache"))[:2]
    for victim in victims:
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
        age(victim)
    before = {p.name for p in root.glob("*-cache")}
    cli = [sys.executable, "-m", "jaxcache", "prune", str(root), "--integrity", "tampered,mismatched,corrupt"]
    # Unsigned, a flipped byte only differs from a record: the proven classes select nothing.
    proc = subprocess.run([*cli, "--apply", "--json"], capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0 and json.loads(proc.stdout)["delete"] == [], proc.stderr
    # `--integrity` alone is the same proven classes; with the writers' key trusted the flips are tampered.
    proc = subprocess.run([*cli[:-1], "--apply", "--json"], capture_output=True, text=True, timeout=120,
                          env=clean_env(JAXCACHE_TRUSTED_KEYS=key[1]))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["policy"]["integrity"] == ["tampered", "mismatched", "corrupt"]
    assert {d["name"] for d in json.loads(proc.stdout)["delete"]} == {v.name for v in victims}
    assert {p.name for p in root.glob("*-cache")} == before - {v.name for v in victims}
    # Their signatures went with them; the others' stayed.
    assert {p.name.removesuffix("-sig") for p in root.glob("*-sig")} == {n.removesuffix("-cache") for n in
                                                                         before - {v.name for v in victims}}
    bad = subprocess.run([*cli[:-1], "unattested"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cannot be selected" in bad.stderr


def test_a_signature_whose_entry_is_gone_is_an_orphan_prune_removes(attested_cache, tmp_path):
    root = copy_of(attested_cache, tmp_path / "c")
    gone = sorted(root.glob("*-cache"))[0]
    gone.unlink()  # as JAX's own LRU evicts: -cache (and -atime) only
    orphan = gone.name.removesuffix("-cache") + "-sig"
    cli = [sys.executable, "-m", "jaxcache", "prune", str(root), "--orphans"]
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0 and "would delete 1 signature object whose" in proc.stdout, proc.stdout + proc.stderr
    assert (root / orphan).exists()
    proc = subprocess.run([*cli, "--apply", "--json"], capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0 and json.loads(proc.stdout)["signature_orphans"] == [orphan], proc.stderr
    assert not (root / orphan).exists() and len(list(root.glob("*-sig"))) == len(list(root.glob("*-cache")))
