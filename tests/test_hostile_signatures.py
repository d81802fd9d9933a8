"""A malformed or huge ``<key>-sig`` object is a verdict on its own entry (#49 items 1 and 2): every reader judges
each signature on its own, so a bad one beside a swapped entry never stops that entry being judged. The readers:
`doctor --verify`, `prune --integrity`, `keys sign --if-signed-by`, `bundle export`, `bundle import`,
`warmup --check`, the service's verify pass, and a job with ``verify="attested"``. Kept with them (#58): `-sig` objects
that are FIFOs, folders or links (never opened nor followed), and 200 signatures in one object."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxcache import signing, skips
from jaxcache.cli import main
from test_bundles import bundle, members, write_tar, written  # noqa: F401 - fixtures
from test_client_service import ADMIN, KEY_PATH, PUBLIC, REPORT, _env, api, service  # noqa: F401 - a fixture
from test_service_integrity import BAD, _app, _expect_verdicts, _headers, _rescanned, damaged  # noqa: F401 - a fixture
from test_service_integrity import READ as SERVICE_READ
from test_verified_loads import _entry, run_job
from test_warmup import EXAMPLE, warmup

# Each raised out of the old decoder (OverflowError, RecursionError) and stopped every reader.
MALFORMED = {
    "size Infinity": b'{"format": "jaxcache-sig/1", "signatures": [{"key": "k", "sha256": "0", "size_bytes": Infinity,'
                     b' "signer": "writers", "signature": ""}]}',
    "nested 60000 deep": b"[" * 60_000,
    "nested in an unknown field": (b'{"format": "jaxcache-sig/1", "signatures": [], "x": ' + b"[" * 30_000
                                   + b"]" * 30_000 + b"}"),  # within the size limit
}
GIB = 1 << 30


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxcache", *args], capture_output=True, text=True, timeout=120,
                          env=_env(JAXCACHE_TRUSTED_KEYS=PUBLIC, **(env or {})))


def one_line_or_none(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") <= 1, proc.stderr


def _age(root: Path) -> None:
    old = time.time() - 7200
    for path in root.glob("*-cache"):
        os.utime(path, (old, old))


def hostile(written: Path, tmp_path: Path, sig: bytes) -> tuple[Path, str, str]:  # noqa: F811
    """A copy of ``written`` with ``sig`` as one entry's ``-sig`` and another entry's bytes swapped for a third's:
    ``(root, the key with the bad signature, the swapped key)``."""
    root = tmp_path / "root"
    shutil.copytree(written, root)
    bad, swapped, source = sorted(p.name.removesuffix("-cache") for p in root.glob("*-cache"))[:3]
    (root / signing.sig_name(bad)).write_bytes(sig)
    shutil.copyfile(root / f"{source}-cache", root / f"{swapped}-cache")
    _age(root)
    return root, bad, swapped


@pytest.mark.parametrize("sig", list(MALFORMED.values()), ids=list(MALFORMED))
def test_decode_answers_a_malformed_signature_object_with_one_error(sig):
    with pytest.raises(signing.InvalidInputError, match="not a jaxcache signature object"):
        signing.decode(sig)
    assert signing.found_in(sig, "k", signing.TrustedKeys.parse(PUBLIC)).judge(b"x") == skips.BAD_SIGNATURE


def _plant(path: Path, jam: str) -> None:
    """Put a FIFO, a folder or a link where ``path`` (a ``-sig`` object) is; the link leads out of the root to a
    copy of the real signature object, which a reader that followed it would take as proof."""
    real = path.read_bytes()
    path.unlink()
    if jam == "fifo":
        os.mkfifo(path)
    elif jam == "directory":
        path.mkdir()
    else:
        outside = path.parent.parent / "outside-sig"
        outside.write_bytes(real)
        path.symlink_to(outside)


JAMS = ["fifo", "directory", "link to a valid signature outside the root"]
KIND = {"fifo": "a FIFO", "directory": "a directory", "link to a valid signature outside the root": "a symbolic link"}


@pytest.mark.parametrize("bad_sig", [*MALFORMED, *JAMS])
def test_every_command_judges_the_entries_beside_a_bad_signature_object(written, tmp_path, bad_sig):  # noqa: F811
    """A malformed ``-sig`` (#49), or one that is not a file (#58: never opened, as a FIFO would block a reader, nor
    followed). Commands run as processes: one blocked would time out."""
    root, bad, swapped = hostile(written, tmp_path, MALFORMED.get(bad_sig, b""))
    sig = root / signing.sig_name(bad)
    if bad_sig in JAMS:
        _plant(sig, bad_sig)
    said = f"{sig.name} is not a file: ignored" if bad_sig in JAMS else "is not a jaxcache signature object"

    proc = cli("doctor", str(root), "--verify", "--json")
    one_line_or_none(proc)
    found = json.loads(proc.stdout)
    judged = {e["key"]: e for e in found["entries"]}
    assert proc.returncode == 1 and judged[swapped]["class"] == "tampered", proc.stdout
    assert judged[bad]["class"] == "ok"  # its bytes are as its writer recorded; the signature proves nothing
    assert any(said in r for r in judged[bad]["reasons"]), judged[bad]
    skipped = {s["name"]: s["reason"] for s in found["skipped"]}
    assert skipped == ({sig.name: f"{KIND[bad_sig]}, not a regular file"} if bad_sig in JAMS else {}), skipped

    proc = cli("keys", "sign", str(root), "--key", KEY_PATH, "--if-signed-by", "writers", "--dry-run", "--json")
    one_line_or_none(proc)
    why = {s["key"]: s["why"] for s in json.loads(proc.stdout)["skipped"]}
    assert proc.returncode == 1 and why[bad] == "not signed by writers" and "tampered" in why[swapped], proc.stdout

    out = tmp_path / "train.tar"
    proc = cli("bundle", "export", str(root), "--job", "train", "-o", str(out), "--json")
    one_line_or_none(proc)
    exported = json.loads(proc.stdout)
    assert proc.returncode == 0 and bad in exported["keys"] and swapped in {x["key"] for x in exported["left_out"]}
    with_sig = {name.removesuffix("-sig") for name, _ in members(out) if name.endswith("-sig")}
    assert bad not in with_sig and len(with_sig) == len(exported["keys"]) - 1  # carried without its bad signature

    proc = cli("prune", str(root), "--integrity", "--apply", "--json")
    one_line_or_none(proc)
    assert proc.returncode == 0 and [d["key"] for d in json.loads(proc.stdout)["delete"]] == [swapped], proc.stdout
    if bad_sig in JAMS:
        assert {"fifo": sig.is_fifo, "directory": sig.is_dir}.get(bad_sig, sig.is_symlink)(), "left as it was"
        # Signing every entry signs all but this one, which it names, and leaves what is planted there alone.
        proc = cli("keys", "sign", str(root), "--key", KEY_PATH, "--json")
        one_line_or_none(proc)
        done = json.loads(proc.stdout)
        assert proc.returncode == 0 and bad not in done["signed"] and len(done["signed"]) >= 2, proc.stdout
        assert done["skipped"] == [{"key": bad, "why": f"its {sig.name} is not a regular file: left as it is (remove"
                                                       " it, then sign again)"}]
        assert {"fifo": sig.is_fifo, "directory": sig.is_dir}.get(bad_sig, sig.is_symlink)(), "left as it was"


@pytest.mark.parametrize("sig", list(MALFORMED.values()), ids=list(MALFORMED))
def test_bundle_import_refuses_only_the_entry_whose_signature_is_malformed(bundle, tmp_path, capsys, sig,  # noqa: F811
                                                                           monkeypatch):
    items = dict(members(bundle))
    key, *rest = [e["key"] for e in json.loads(items["manifest.json"])["entries"]]
    items[f"{key}-sig"] = sig
    path = write_tar(tmp_path / "bad-sig.tar", list(items.items()))
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, PUBLIC)
    capsys.readouterr()
    code = main(["bundle", "import", str(path), str(tmp_path / "root"), "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert code == 1 and answer["refused"] == [{"key": key, "why": skips.BAD_SIGNATURE}], answer
    assert answer["imported"] == rest
    # Without trusted keys the digests vouch for the entry: imported, its malformed signature left behind.
    monkeypatch.delenv(signing.TRUSTED_KEYS_ENV)
    code = main(["bundle", "import", str(path), str(tmp_path / "plain"), "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert code == 0 and key in answer["imported"] and not (tmp_path / "plain" / signing.sig_name(key)).exists()


@pytest.mark.slow
def test_warmup_check_judges_a_program_whose_signature_is_malformed(tmp_path):
    cache = tmp_path / "c"
    args = ("--topology", "1x1x2", "--platform", "cpu", "--entrypoint", EXAMPLE)
    warmup(*args, "--cache-dir", str(cache), env=_env())  # signs what it writes
    (sig,) = cache.glob("*-sig")
    sig.write_bytes(MALFORMED["nested 60000 deep"])
    proc = warmup(*args, "--cache-dir", str(cache), "--check", "--json", expect=None,
                  env=_env(JAXCACHE_TRUSTED_KEYS=PUBLIC))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    assert out["hits"] == 0 and skips.BAD_SIGNATURE in json.dumps(out["misses"]), out


def test_a_huge_signature_object_is_never_read_whole(written, tmp_path):  # noqa: F811
    """A sparse 3 GiB ``-sig``: judged as not a signature, read no further than the limit, under a 1.5 GiB address
    space ceiling that reading it whole would break."""
    root, bad, swapped = hostile(written, tmp_path, b"")
    with open(root / signing.sig_name(bad), "wb") as f:
        f.truncate(3 * GIB)
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29));"
              " from jaxcache.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", script, "doctor", str(root), "--verify", "--json"],
                          capture_output=True, text=True, timeout=120, env=_env(JAXCACHE_TRUSTED_KEYS=PUBLIC))
    one_line_or_none(proc)
    judged = {e["key"]: e for e in json.loads(proc.stdout)["entries"]}
    assert proc.returncode == 1 and judged[swapped]["class"] == "tampered", proc.stdout
    assert any(f"larger than {signing.MAX_SIG_BYTES} bytes" in r for r in judged[bad]["reasons"]), judged[bad]


def test_the_service_judges_every_entry_beside_a_malformed_signature(damaged, tmp_path):  # noqa: F811
    """...and its integrity view names each bad signature on the entry's row, whose class stays what its bytes prove
    (#58 item 7): the summary's problems, the dashboard's overview and the entry's page."""
    root = tmp_path / "cache"
    shutil.copytree(damaged["root"], root)
    broken = {damaged[k] for k in ("flipped", "swapped", "truncated", "plain")}
    badly = dict(zip(sorted(damaged["all"] - broken), MALFORMED.values(), strict=False))
    for key, sig in badly.items():
        (root / signing.sig_name(key)).write_bytes(sig)
    with _app(str(root), tmp_path) as client:
        _rescanned(client)  # after the background pass's first round over this root
        # POST verify answers 200; the swapped entry is judged tampered
        summary = _expect_verdicts(client, damaged, signed_badly=set(badly))
        assert summary["bad_signatures"] == len(badly) > 0
        # Bad signatures are listed after the proven-bad entries: planting them never pushes one past the limit a
        # verifying job asks with (it refuses only the entries listed).
        proven = {k for k, p in {p["key"]: p for p in summary["problems"]}.items() if p["class"] in BAD}
        asked = client.get("/v1/integrity", params={"cache_dir": str(root), "limit": len(proven)},
                           headers=_headers(SERVICE_READ)).json()
        assert {p["key"] for p in asked["problems"]} == proven, asked["problems"]
        overview = client.get("/caches/c", headers=_headers(SERVICE_READ)).text
        assert overview.count('data-signature="bad signature"') == len(badly), overview
        assert f'data-bad-signatures="{len(badly)}"' in overview
        key = sorted(badly)[0]
        entry = client.get(f"/v1/caches/c/entries/{key}", headers=_headers(SERVICE_READ)).json()
        assert (entry["integrity"], entry["integrity_signature"]) == ("ok", skips.BAD_SIGNATURE), entry
        page = client.get(f"/caches/c/entries/{key}", headers=_headers(SERVICE_READ)).text
        assert 'class="status-ok">ok</span>, <strong class="warn" data-signature="bad signature">' in page


def moved(root, key: str) -> bytes:
    """``key``'s valid ``-sig``, as it would be copied beside another entry: a signature of another key."""
    return (root / signing.sig_name(key)).read_bytes()


@pytest.mark.parametrize("sig", [*MALFORMED, "moved from another entry"])
def test_doctor_verify_names_a_bad_signature_on_its_entrys_line(written, tmp_path, sig):  # noqa: F811
    """The entry's class is what its bytes prove (ok) and the exit code stays 0, but its line names the bad
    signature beside it (#58 item 7): only --json said so."""
    root = tmp_path / "root"
    shutil.copytree(written, root)
    bad, other = sorted(p.name.removesuffix("-cache") for p in root.glob("*-cache"))[:2]
    (root / signing.sig_name(bad)).write_bytes(MALFORMED[sig] if sig in MALFORMED else moved(root, other))
    _age(root)
    proc = cli("doctor", str(root), "--verify")
    one_line_or_none(subprocess.CompletedProcess(proc.args, proc.returncode, "", proc.stderr))
    lines = [line for line in proc.stdout.splitlines() if f"{bad}-cache" in line]
    assert proc.returncode == 0 and len(lines) == 1, proc.stdout
    assert lines[0].startswith("ok, bad signature") and "signature" in lines[0].split(f"{bad}-cache", 1)[1], lines
    assert "1 entry with a bad signature beside it" in proc.stdout.splitlines()[0], proc.stdout
    assert not any(f"{other}-cache" in line for line in proc.stdout.splitlines()), proc.stdout
    judged = {e["key"]: e for e in json.loads(cli("doctor", str(root), "--verify", "--json").stdout)["entries"]}
    assert (judged[bad]["class"], judged[bad]["signature"]) == ("ok", skips.BAD_SIGNATURE), judged[bad]
    assert judged[other]["signature"] is None


@pytest.mark.slow
def test_a_verifying_job_never_loads_a_swapped_entry_beside_a_malformed_or_fifo_signature(service):  # noqa: F811
    base, cache = service
    job = (sys.executable, {})
    run_job(job, cache, "writer")  # attested to the service, and signed
    affine, gram, wave = _entry(cache, "affine"), _entry(cache, "gram"), _entry(cache, "wave")
    key = {p: p.name.removesuffix("-cache") for p in (affine, gram, wave)}
    gram.write_bytes(affine.read_bytes())  # another program's bytes under gram's key
    _age(cache)
    (cache / signing.sig_name(key[affine])).write_bytes(MALFORMED["size Infinity"])
    _plant(cache / signing.sig_name(key[wave]), "fifo")  # never opened: a reader would block on it
    api(base, "/v1/caches/shared/rescan", ADMIN, "POST")
    api(base, "/v1/caches/shared/verify", ADMIN, "POST")  # 200, not 500
    # client_job checks every result: loading gram's swapped bytes would fail the job.
    out = run_job(job, cache, "careful", "--verify", "attested", "--service-url", base, "--token", REPORT)
    assert out["skipped"] == {key[gram]: skips.TAMPERED}, out["skipped"]
    signed = run_job((sys.executable, {"JAXCACHE_TRUSTED_KEYS": PUBLIC}), cache, "signed", "--verify", "signed")
    assert signed["skipped"] == {key[affine]: skips.BAD_SIGNATURE, key[gram]: skips.DIGEST_DIFFERS,
                                 key[wave]: skips.UNSIGNED}, signed


@pytest.mark.gcs
def test_a_huge_signature_object_in_a_gcs_root_is_judged_from_a_ranged_read(written, gcs_client, gcs_bucket):  # noqa: F811
    bucket = gcs_client.bucket(gcs_bucket)
    for path in written.rglob("*"):
        if path.is_file():
            bucket.blob(f"jc/{path.relative_to(written)}").upload_from_filename(str(path))
    bad = sorted(p.name.removesuffix("-cache") for p in written.glob("*-cache"))[0]
    bucket.blob(f"jc/{signing.sig_name(bad)}").upload_from_string(b" " * (8 << 20))  # 8 MiB of whitespace
    proc = cli("doctor", f"gs://{gcs_bucket}/jc", "--verify", "--min-age", "0s", "--json")
    one_line_or_none(proc)
    judged = {e["key"]: e for e in json.loads(proc.stdout)["entries"]}
    assert proc.returncode == 0 and {e["class"] for e in judged.values()} == {"ok"}, proc.stdout
    assert any(f"larger than {signing.MAX_SIG_BYTES} bytes" in r for r in judged[bad]["reasons"]), judged[bad]


@pytest.mark.parametrize("jam", JAMS)
def test_the_service_judges_every_entry_beside_a_signature_that_is_not_a_file(damaged, tmp_path, jam):  # noqa: F811
    root = tmp_path / "cache"
    shutil.copytree(damaged["root"], root)
    broken = {damaged[k] for k in ("flipped", "swapped", "truncated", "plain")}
    _plant(root / signing.sig_name(min(damaged["all"] - broken)), jam)
    with _app(str(root), tmp_path) as client:
        _rescanned(client)
        _expect_verdicts(client, damaged)  # judged as unsigned, which its writer's record attests: ok


def _object(sigs: list[signing.Signature]) -> bytes:
    """A ``-sig`` object of ``sigs`` written compactly (no writer, no time), so 200 fit within MAX_SIG_BYTES."""
    fields = ("key", "sha256", "size_bytes", "signer", "signature")
    return json.dumps({"format": signing.FORMAT, "signatures": [{f: getattr(s, f) for f in fields} for s in sigs]},
                      separators=(",", ":")).encode()


@pytest.mark.parametrize("trusted_one", [True, False], ids=["199 forged and the real one last", "200 forged"])
def test_two_hundred_signatures_in_one_object_prove_only_what_a_trusted_one_signs(bundle, tmp_path, capsys,  # noqa: F811
                                                                                  monkeypatch, trusted_one):
    """A ``-sig`` of 200 signatures, each claiming the trusted key's name (#58): each is checked on its own, and the
    entry is proven only by one that verifies."""
    items = dict(members(bundle))
    key, *rest = [e["key"] for e in json.loads(items["manifest.json"])["entries"]]
    data = items[f"{key}-cache"]
    digest = hashlib.sha256(data).hexdigest()
    forger = signing.new_key("writers", str(tmp_path / "forged.key"))  # the trusted key's name, another key
    sigs = [forger.sign(key, digest, len(data)) for _ in range(199 if trusted_one else 200)]
    if trusted_one:
        sigs.append(signing.load_key(KEY_PATH).sign(key, digest, len(data)))
    items[f"{key}-sig"] = _object(sigs)
    assert len(items[f"{key}-sig"]) <= signing.MAX_SIG_BYTES and len(signing.decode(items[f"{key}-sig"])) == 200
    path = write_tar(tmp_path / "many.tar", list(items.items()))
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, PUBLIC)
    capsys.readouterr()
    code = main(["bundle", "import", str(path), str(tmp_path / "root"), "--json"])
    answer = json.loads(capsys.readouterr().out)
    if trusted_one:
        assert code == 0 and answer["imported"] == [key, *rest] and answer["refused"] == [], answer
    else:
        assert code == 1 and answer["refused"] == [{"key": key, "why": skips.BAD_SIGNATURE}], answer
        assert answer["imported"] == rest and not (tmp_path / "root" / f"{key}-cache").exists()
