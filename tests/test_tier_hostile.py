"""The node-local tier under attack (#49, #58): another local user planting links and directories where the tier goes
by default, bytes swapped under a write-behind's pending mark, a tier left without an entry's ``-atime``, a root
changed under a node's copies (emptied, pruned, an entry tampered with and put right, a signature replaced), and a
resumed upload meeting the mark of a process still running. Real jobs (tests/programs/client_job.py) on a gs://
root on fake-gcs-server, or a local root; the other user is ``nobody``, whose files root plants (CI runs as root)."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import zstandard

from jaxcache import signing, skips
from jaxcache.client import options as client_options
from jaxcache.entry import TIME_HEADER_BYTES
from jaxcache.storage import gcs as gcs_backend
from test_client_service import ADMIN, JOB, KEY_PATH, PUBLIC, REPORT, _env, api, service  # noqa: F401 - a fixture
from test_local_tier import PROGRAMS, _node_env, entries, faults, root_objects, run_job  # noqa: F401 - a fixture
from test_verified_loads import _age, _entry

pytestmark = [pytest.mark.gcs, pytest.mark.slow]


def other_user() -> tuple[int, int]:
    """The uid and gid of a second local user whose files this process can plant (it must be root)."""
    if os.geteuid() != 0:
        pytest.skip("planting files as another local user needs root (CI runs as root)")
    try:
        who = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no second local user (nobody) on this machine")
    return who.pw_uid, who.pw_gid


def node_without_home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A temp dir (sticky, world-writable, as /tmp) that is the only default candidate: $XDG_CACHE_HOME and ~/.cache
    are blocked by files where they would go (root is not stopped by permissions)."""
    blocked = tmp_path / "home"
    blocked.mkdir()
    (blocked / "xdg").write_text("")
    (blocked / ".cache").write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    return tmp, {"XDG_CACHE_HOME": str(blocked / "xdg"), "HOME": str(blocked), "TMPDIR": str(tmp)}


def job(root: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(JOB), "--cache-dir", root, "--job", "careful", *args],
                          capture_output=True, text=True, timeout=300, env=_env(**env))


def out_of(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tier_tail(root: str, policy: str) -> str:
    """Where under a default candidate's base the tier of ``root`` and ``policy`` goes."""
    (first, *_) = client_options.local_candidates(root, None, {"XDG_CACHE_HOME": "/x"})
    return os.path.join(os.path.relpath(first, "/x"), policy)


def test_a_link_another_user_plants_at_the_default_tier_never_gets_bytes_loaded(tmp_path, gcs_bucket):
    uid, gid = other_user()
    root = f"gs://{gcs_bucket}/jc"
    # Real entries, never signed, that the other user wants a verify="signed" job to load.
    run_job(root, tmp_path / "writer", "writer", JAXCACHE_SIGNING_KEY="")
    planted = entries(tmp_path / "writer" / "unchecked")
    tmp, env = node_without_home(tmp_path)
    policy = f"signed-{signing.TrustedKeys.parse(PUBLIC).digest()[:12]}"
    harmless, evil = tmp_path / "harmless", tmp_path / "evil"
    for base in (harmless, evil):
        (base / tier_tail(root, policy)).mkdir(parents=True)
    for name, data in planted.items():
        (evil / tier_tail(root, policy) / name).write_bytes(data)
    for path in [evil, *evil.rglob("*")]:
        os.lchown(path, uid, gid)
    # The link at <temp dir>/jaxcache-<uid> is the other user's; it points at a directory that looks like ours
    # when the client checks, and at the planted entries once enable_cache has returned.
    link = tmp / f"jaxcache-{os.getuid()}"
    link.symlink_to(harmless)
    os.lchown(link, uid, gid)
    signed = ("--verify", "signed", "--relink", str(link), str(evil))
    proc = job(root, *signed, JAXCACHE_TRUSTED_KEYS=PUBLIC, **env)
    out = out_of(proc)
    # Passed over with one warning, like a directory that cannot be written: JAX reads the root, which holds
    # nothing signed, so every program is compiled; nothing planted loads.
    assert out["local_dir"] is None and out["stats"]["hits"] == 0, out
    assert out["stats"]["misses"] == len(PROGRAMS), out["stats"]
    assert proc.stderr.count("not only yours") == 1 and proc.stderr.count("jaxcache: ") >= 1, proc.stderr
    assert f"{link} is a symbolic link owned by uid {uid}" in proc.stderr, proc.stderr


def test_a_directory_another_user_made_at_the_default_tier_is_passed_over(tmp_path, gcs_bucket):
    uid, gid = other_user()
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "writer", "writer")  # signed entries in the root
    tmp, env = node_without_home(tmp_path)
    theirs = tmp / f"jaxcache-{os.getuid()}"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, uid, gid)
    proc = job(root, "--verify", "signed", JAXCACHE_TRUSTED_KEYS=PUBLIC, **env)
    out = out_of(proc)  # strict: not refused, the tier is only not there
    assert out["local_dir"] is None and out["stats"]["hits"] == len(PROGRAMS), out
    assert proc.stderr.count("no node-local directory is writable") == 1, proc.stderr
    assert f"{theirs} is owned by uid {uid}" in proc.stderr, proc.stderr
    assert os.listdir(theirs) == []  # nothing created in the other user's directory

    # A directory the user names is judged strictly, as any cache directory.
    refused = job(root, JAXCACHE_LOCAL_DIR=str(theirs))
    assert refused.returncode == 3 and f"owned by uid {uid}" in refused.stderr, refused.stderr


def test_a_resumed_upload_sends_only_the_bytes_jax_put_with_the_signature_made_then(
        tmp_path, faults, gcs_client, gcs_bucket):  # noqa: F811 - a fixture
    root = f"gs://{gcs_bucket}/jc"
    node = tmp_path / "node"
    faults.fail(10_000, 503, method="POST", body=rb'-cache"')  # uploads of entries fail: all four stay pending
    run_job(root, node, "train", settle=False, JAXCACHE_UPLOAD_WAIT_S="1")
    local = node / "unchecked"
    assert len(os.listdir(local / ".jaxcache" / "pending")) == len(PROGRAMS)
    (affine,) = [p for p in local.glob("jit_affine-*-cache")]
    (gram,) = [p for p in local.glob("jit_gram-*-cache")]
    swapped = affine.read_bytes()
    gram.write_bytes(swapped)  # other bytes, whole, at a key whose upload is pending

    faults.clear()
    again, err = run_job(root, node, "train", "--programs", "wave")  # resumes every pending upload
    stored = root_objects(gcs_client, gcs_bucket)
    assert gram.name not in stored, "bytes JAX never put under that key reached the root"
    signed_over = {s.sha256 for n, data in stored.items() if n.endswith(signing.SIG_SUFFIX)
                   for s in signing.decode(data)}
    assert not [n for n in stored if n.endswith("-cache") and n != affine.name and hashlib.sha256(
        stored[n]).hexdigest() == hashlib.sha256(swapped).hexdigest()]
    assert again["local"]["upload_refused"] == 1 and again["local"]["uploaded"] == len(PROGRAMS) - 1, again["local"]
    assert "not the bytes JAX put" in err, err
    assert not gram.exists() and os.listdir(local / ".jaxcache" / "pending") == []
    # The others went up with the signatures made when JAX put them: each covers exactly the root's bytes.
    for name, data in stored.items():
        if name.endswith("-cache"):
            (sig,) = signing.decode(stored[signing.sig_name(name.removesuffix("-cache"))])
            assert (sig.sha256, sig.size_bytes) == (hashlib.sha256(data).hexdigest(), len(data)), name
            assert sig.sha256 in signed_over


def test_the_first_job_after_a_change_in_a_gcs_root_loads_nothing_the_root_lacks(
        tmp_path, faults, gcs_client, gcs_bucket):  # noqa: F811 - a fixture
    root = f"gs://{gcs_bucket}/jc"
    node = tmp_path / "node"
    run_job(root, node, "train")
    bucket = gcs_client.bucket(gcs_bucket)
    # A prune of one entry, and a root that will not list for the job (its identity may not): the listing never
    # vouches, so each lookup asks the root for its one object.
    (gram,) = [n for n in root_objects(gcs_client, gcs_bucket) if n.startswith("jit_gram-") and n.endswith("-cache")]
    bucket.blob(f"jc/{gram}").delete()
    faults.fail(1000, 403, method="GET", path=r"/o\?")
    pruned, err = run_job(root, node, "train", JAXCACHE_PREFETCH="0")
    assert pruned["stats"]["hits"] == len(PROGRAMS) - 1 and pruned["stats"]["misses"] == 1, pruned["stats"]
    assert pruned["local"]["dropped"] == 1 and pruned["local"]["loaded"] == len(PROGRAMS) - 1, pruned["local"]
    assert "no longer has" in err, err

    faults.clear()
    for name in root_objects(gcs_client, gcs_bucket):
        bucket.blob(f"jc/{name}").delete()  # the bucket emptied: the first job after it compiles everything
    emptied, _ = run_job(root, node, "train")
    assert emptied["stats"]["hits"] == 0 and emptied["stats"]["misses"] == len(PROGRAMS), emptied["stats"]


def test_the_first_job_after_a_change_in_a_local_root_loads_nothing_the_root_lacks(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    node = tmp_path / "node"
    run_job(str(root), node, "train")
    assert len(entries(node / "unchecked")) == len(PROGRAMS)
    (gram,) = root.glob("jit_gram-*-cache")
    gram.unlink()  # pruned
    pruned, _ = run_job(str(root), node, "train")
    assert pruned["stats"]["hits"] == len(PROGRAMS) - 1 and pruned["stats"]["misses"] == 1, pruned["stats"]
    for path in root.glob("*-cache"):
        path.unlink()  # the root emptied
    emptied, _ = run_job(str(root), node, "train")
    assert emptied["stats"]["hits"] == 0 and emptied["stats"]["misses"] == len(PROGRAMS), emptied["stats"]


def test_an_entry_left_without_its_atime_is_healed_at_start(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    node = tmp_path / "node"
    run_job(str(root), node, "train", "--programs", "affine,gram")
    local = node / "unchecked"
    (gram,) = local.glob("jit_gram-*-cache")
    gram_key = gram.name.removesuffix("-cache")
    (local / f"{gram_key}-atime").unlink()  # a kill between JAX's two writes
    torn = "jit_torn-" + "0" * 64
    (local / f"{torn}-cache").write_bytes(gram.read_bytes()[: gram.stat().st_size // 2])  # a disk full mid-write
    (local / ".jaxcache" / "pending" / torn).write_bytes(b"")  # ... of a write still to upload

    # Neither is looked up (a hit rewrites the -atime), and JAX 0.10's eviction reads every -atime: unhealed,
    # JAX's write of wave would fail.
    b, _ = run_job(str(root), node, "train", "--programs", "affine,wave")
    assert b["stats"]["hits"] == 1 and b["stats"]["writes"] == 1, (b["stats"], b["summary"])
    assert (local / f"{gram_key}-atime").exists() and not (local / f"{torn}-cache").exists()
    assert b["local"]["healed"] == 2, b["local"]
    assert f"{gram_key} (its -atime written)" in b["summary"], b["summary"]
    assert f"{torn} (broken without its -atime: removed)" in b["summary"], b["summary"]


def recompressed(data: bytes) -> bytes:
    """Other bytes for the same program: its executable compressed again at another level. They load and compute
    the right thing, so a job that loads them runs; only their digest tells them from the bytes JAX wrote."""
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    other = zstandard.ZstdCompressor(level=19).compress(raw)
    assert other != data
    return other


def test_a_copy_whose_object_was_replaced_in_a_gcs_root_is_fetched_again(
        tmp_path, faults, gcs_client, gcs_bucket):  # noqa: F811 - a fixture
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "writer", "train")
    bucket = gcs_client.bucket(gcs_bucket)
    (gram,) = [n for n in root_objects(gcs_client, gcs_bucket) if n.startswith("jit_gram-") and n.endswith("-cache")]
    good = bucket.blob(f"jc/{gram}").download_as_bytes()
    tampered = recompressed(good)
    bucket.blob(f"jc/{gram}").upload_from_string(tampered)
    node = tmp_path / "node"
    first, _ = run_job(root, node, "train")  # ahead of JAX (the job's working set) or when it asks
    assert first["local"]["fetched"] + first["local"]["prefetched"] == len(PROGRAMS), first["local"]
    assert (node / "unchecked" / gram).read_bytes() == tampered

    # The original bytes put back (a new object, of a new generation): the node's next job fetches them again.
    bucket.blob(f"jc/{gram}").upload_from_string(good)
    again, _ = run_job(root, node, "train", JAXCACHE_PREFETCH="0")
    assert again["local"]["dropped"] == 1 and again["local"]["fetched"] == 1, again["local"]
    assert again["stats"]["hits"] == len(PROGRAMS), again["stats"]
    assert (node / "unchecked" / gram).read_bytes() == good

    # And where the root will not list (so each lookup asks the root for its one object), as at the first lookups
    # of a job whose listing has not vouched yet: the object's generation is compared too.
    bucket.blob(f"jc/{gram}").upload_from_string(tampered)
    faults.fail(1000, 403, method="GET", path=r"/o\?")
    unlisted, err = run_job(root, node, "train", JAXCACHE_PREFETCH="0")
    assert "is not the one its local copy came from" in err, err
    assert unlisted["local"]["dropped"] == 1 and unlisted["local"]["fetched"] == 1, unlisted["local"]
    assert unlisted["local"]["loaded"] == len(PROGRAMS) - 1, unlisted["local"]
    assert (node / "unchecked" / gram).read_bytes() == tampered  # the root's current object, whatever it holds


def test_a_copy_whose_file_was_replaced_in_a_local_root_is_fetched_again(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    run_job(str(root), "off", "writer")
    gram = _entry(root, "gram")
    good = gram.read_bytes()
    gram.write_bytes(recompressed(good))
    node = tmp_path / "node"
    run_job(str(root), node, "train")
    gram.write_bytes(good)  # put right: the same name, another file (its size and modification time)
    again, _ = run_job(str(root), node, "train", JAXCACHE_PREFETCH="0")  # on demand: counted as fetched
    assert again["local"]["dropped"] == 1 and again["local"]["fetched"] == 1, again["local"]
    assert (node / "unchecked" / gram.name).read_bytes() == good


def test_a_tampered_copy_leaves_an_attested_node_once_the_root_is_put_right(service, tmp_path):  # noqa: F811
    base, cache = service  # the real service over a local root, with a node-local tier in front of it
    attested = ("--verify", "attested", "--service-url", base, "--token", REPORT)
    run_job(str(cache), "off", "writer")
    gram = _entry(cache, "gram")
    good = gram.read_bytes()
    tampered = recompressed(good)
    gram.write_bytes(tampered)  # before the service's next verification pass
    node = tmp_path / "node"
    first, _ = run_job(str(cache), node, "careful", *attested)
    assert first["local"]["fetched"] == len(PROGRAMS) and (node / "attested" / gram.name).read_bytes() == tampered

    gram.write_bytes(good)
    _age(gram)  # judged now, not pending
    api(base, "/v1/caches/shared/rescan", ADMIN, "POST")
    api(base, "/v1/caches/shared/verify", ADMIN, "POST")
    assert api(base, "/v1/caches/shared/integrity")["problems"] == []  # all is well in the root

    again, _ = run_job(str(cache), node, "careful", *attested, JAXCACHE_PREFETCH="0")
    assert again["local"]["dropped"] == 1 and again["local"]["fetched"] == 1, again["local"]
    assert again["stats"]["hits"] == len(PROGRAMS) and again["skipped"] == {}, again
    assert (node / "attested" / gram.name).read_bytes() == good


def same_sized(data: bytes) -> bytes:
    """Other bytes of the same size for the same program: the compile time JAX keeps ahead of the executable changed,
    compressed again as JAX compresses (zstd's default level), at the first time that keeps the size. They load and
    compute the right thing; only their digest tells them from the bytes JAX wrote."""
    executable = zstandard.ZstdDecompressor().decompressobj().decompress(data)[TIME_HEADER_BYTES:]
    for seconds in range(1, 1000):
        other = zstandard.ZstdCompressor().compress(seconds.to_bytes(TIME_HEADER_BYTES, "big") + executable)
        if other != data and len(other) == len(data):
            return other
    raise AssertionError("no other bytes of the same size")


def test_a_copy_put_right_unseen_in_a_local_root_leaves_an_attested_node_by_its_digest(service, tmp_path):  # noqa: F811
    base, cache = service
    attested = ("--verify", "attested", "--service-url", base, "--token", REPORT)
    run_job(str(cache), "off", "writer")  # its run record carries the digest of each entry it wrote
    gram = _entry(cache, "gram")
    good = gram.read_bytes()
    tampered = same_sized(good)
    gram.write_bytes(tampered)
    _age(gram)  # judged when put right, not pending
    planted = gram.stat()
    node = tmp_path / "node"
    first, _ = run_job(str(cache), node, "careful", *attested)
    assert first["local"]["fetched"] == len(PROGRAMS) and (node / "attested" / gram.name).read_bytes() == tampered

    # Put right by someone who can write the root and set times: the same size and modification time as the
    # tampered file's, so the copy's origin still names the root's object. The service's verdicts are all well.
    gram.write_bytes(good)
    os.utime(gram, ns=(planted.st_atime_ns, planted.st_mtime_ns))
    api(base, "/v1/caches/shared/rescan", ADMIN, "POST")  # and the writer's record: the digest of `good`
    verified = httpx.post(f"{base}/v1/caches/shared/verify", json={"recheck_all": True},
                          headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert verified.status_code == 200, verified.text
    assert api(base, "/v1/caches/shared/integrity")["problems"] == []

    again, err = run_job(str(cache), node, "careful", *attested, JAXCACHE_PREFETCH="0")
    assert again["local"]["dropped"] == 1 and again["local"]["fetched"] == 1, again["local"]
    assert "1 local copies" in err and "not the bytes the service attests" in err, err
    assert again["stats"]["hits"] == len(PROGRAMS) and again["skipped"] == {}, again
    assert (node / "attested" / gram.name).read_bytes() == good
    # The copy fetched during that job was kept with its digest: the next job loads every copy.
    third, _ = run_job(str(cache), node, "careful", *attested, JAXCACHE_PREFETCH="0")
    assert third["local"]["dropped"] == 0 and third["local"]["loaded"] == len(PROGRAMS), third["local"]


def test_a_signed_copy_loads_only_while_a_trusted_signature_in_the_root_names_its_bytes(
        tmp_path, gcs_client, gcs_bucket):
    root = f"gs://{gcs_bucket}/jc"
    signed = ("--verify", "signed")
    run_job(root, tmp_path / "writer", "train")  # signs what it writes
    node = tmp_path / "node"
    first, _ = run_job(root, node, "careful", *signed, JAXCACHE_TRUSTED_KEYS=PUBLIC)
    assert first["local"]["fetched"] == len(PROGRAMS) and first["skipped"] == {}, first
    (gram,) = [n for n in entries(Path(first["local_dir"])) if n.startswith("jit_gram-")]
    key = gram.removesuffix("-cache")
    # The trusted writer's signature replaced by one of the same key over other bytes: neither the root's entry nor
    # the node's copy is what it names now.
    other = recompressed(gcs_client.bucket(gcs_bucket).blob(f"jc/{gram}").download_as_bytes())
    resigned = signing.load_key(KEY_PATH).sign(key, hashlib.sha256(other).hexdigest(), len(other))
    gcs_client.bucket(gcs_bucket).blob(f"jc/{signing.sig_name(key)}").upload_from_string(signing.encode([resigned]))

    again, _ = run_job(root, node, "careful", *signed, JAXCACHE_TRUSTED_KEYS=PUBLIC)
    assert again["skipped"] == {key: skips.DIGEST_DIFFERS}, again["skipped"]
    assert again["local"]["dropped"] == 1 and again["local"]["loaded"] == len(PROGRAMS) - 1, again["local"]
    assert again["stats"]["hits"] == len(PROGRAMS) - 1 and again["stats"]["misses"] == 1, again["stats"]


PUT_BUT_NOT_WRITTEN = """
import hashlib, json, os, sys
from jaxcache.client.local_tier import LocalTier
from jaxcache.client.uploads import Uploader
from jaxcache.storage import open_storage

directory, url, key, source = sys.argv[1:]
root = open_storage(url)
tier = LocalTier(directory, lambda: root, policy=None, refused=lambda key, why: None, max_size_bytes=None)
uploader = Uploader(tier, signing_key=None)
data = open(source, "rb").read()
sha = hashlib.sha256(data).hexdigest()
uploader.on_put(key, sha, len(data))  # JAX's put heard: marked pending; JAX has not written the file yet
print("marked", flush=True)
sys.stdin.readline()
with open(os.path.join(directory, key + "-cache"), "wb") as f:  # JAX's write
    f.write(data)
uploader.submit(key, sha, len(data))  # read back whole: its upload
uploader.drain(60, final=True)
print(json.dumps({"uploaded": tier.counts.uploaded, "failed": tier.counts.upload_failed}), flush=True)
"""


def test_a_resumed_upload_never_clears_the_mark_of_a_process_still_running(
        tmp_path, faults, gcs_client, gcs_bucket):  # noqa: F811 - a fixture
    root = f"gs://{gcs_bucket}/jc"
    node = tmp_path / "node"
    run_job(root, node, "train")
    local = node / "unchecked"
    source = tmp_path / "entry"
    source.write_bytes(recompressed(_entry(local, "gram").read_bytes()))
    key = "jit_late-" + "1" * 64
    # A process of the node between JAX's put and its write (the window is short; here it waits to be told).
    writer = subprocess.Popen([sys.executable, "-c", PUT_BUT_NOT_WRITTEN, str(local), root, key, str(source)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_node_env(node, **{gcs_backend.RETRY_DEADLINE_ENV: "2"}))
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "marked", writer.stderr
        mark = local / ".jaxcache" / "pending" / key
        assert mark.exists()
        # Another job on the node resumes what earlier processes left pending: this mark is a running process's.
        other, _ = run_job(root, node, "train")
        assert other["stats"]["hits"] == len(PROGRAMS) and mark.exists(), other["local"]

        faults.fail(10_000, 503, method="POST", body=rb'-cache"')  # the writer's own upload fails
        out, err = writer.communicate("go\n", timeout=120)
    finally:
        writer.kill()
    assert writer.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"uploaded": 0, "failed": 1}, out
    assert mark.exists()  # so the node's next job uploads it
    faults.clear()
    last, _ = run_job(root, node, "train")
    assert last["local"]["uploaded"] == 1 and not mark.exists(), last["local"]
    assert root_objects(gcs_client, gcs_bucket)[f"{key}-cache"] == source.read_bytes()
