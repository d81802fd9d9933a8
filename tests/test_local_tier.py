"""The node-local tier (#35), for real: JAX jobs on CPU read a directory on their "node", filled on demand from one
gs:// root on fake-gcs-server, and upload what they write. Two local directories stand for two nodes. Faults come
from the fault-injecting proxy in front of the emulator (tests/gcs_faults.py): GCS answering 503 to uploads, and
downloads cut off midway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gcs_faults import GcsFaults
from jaxcache import entry, signing, skips
from jaxcache.cli import main
from jaxcache.client import options as client_options
from jaxcache.errors import InvalidInputError
from jaxcache.storage import gcs as gcs_backend
from test_client_service import ADMIN, JOB, PUBLIC, REPORT, _env, api, service  # noqa: F401 - a fixture
from test_verified_loads import _age, _entry, interpreter  # noqa: F401 - a fixture

pytestmark = [pytest.mark.gcs, pytest.mark.slow]

PROGRAMS = ("affine", "gram", "wave", "grad")


def _node_env(local: Path | str, **env: str) -> dict[str, str]:
    """A job's environment on the "node" ``local``: the retry settings the test set (the ``faults`` fixture's) carried
    over, as the job's own settings are."""
    carried = (gcs_backend.RETRY_DELAY_ENV, gcs_backend.RETRY_DEADLINE_ENV)
    retries = {k: os.environ[k] for k in carried if k in os.environ}
    return _env(JAXCACHE_LOCAL_DIR=str(local), **{**retries, **env})


def run_job(root: str, local: Path | str, job: str, *args: str, settle: bool = True,
            using: tuple[str, dict[str, str]] = (sys.executable, {}), **env: str) -> tuple[dict, str]:
    """One job on one "node" (its local directory), on the interpreter and environment of ``using``; its JSON line
    (``settle``: once its writes are attested and uploaded) and its stderr."""
    settled = ("--settle",) if settle else ()
    python, extra = using
    proc = subprocess.run([python, str(JOB), "--cache-dir", root, "--job", job, *settled, *args],
                          capture_output=True, text=True, timeout=300,
                          env={**_node_env(local, **env), **extra})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def run_together(root: str, local: Path, jobs: list[tuple[str, ...]]) -> list[dict]:
    """Jobs started at once on one "node", each with its own arguments; their JSON lines."""
    procs = [subprocess.Popen([sys.executable, str(JOB), "--cache-dir", root, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_node_env(local))
             for args in jobs]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stdout + stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


def root_objects(client, bucket: str, prefix: str = "jc") -> dict[str, bytes]:
    base = prefix + "/"
    return {b.name[len(base):]: b.download_as_bytes() for b in client.list_blobs(bucket, prefix=base)
            if not b.name[len(base):].startswith(".jaxcache/")}


def entries(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.glob("*-cache")}


def final_record(client, bucket: str, out: dict) -> dict:
    """The run record the job wrote at exit (a gs:// root gets only that one)."""
    return json.loads(client.bucket(bucket).blob(f"jc/{out['record_name']}").download_as_bytes())


@pytest.fixture
def faults(fake_gcs, monkeypatch) -> Iterator[GcsFaults]:
    """The proxy in front of the emulator; jobs started from now on go through it."""
    proxy = GcsFaults(fake_gcs)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    monkeypatch.setenv(gcs_backend.RETRY_DELAY_ENV, "0.02")  # the library's retries, backing off from 20 ms
    try:
        yield proxy
    finally:
        proxy.close()


def test_node_b_gets_node_a_programs_as_hits(tmp_path, capsys, gcs_client, gcs_bucket, interpreter):  # noqa: F811
    """On every supported JAX (each has its own LRU code: jax 0.10's eviction needs every entry's -atime file)."""
    root = f"gs://{gcs_bucket}/jc"
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    # Node A's job ends right after compiling: its uploads finish in the exit's bounded wait.
    a, _ = run_job(root, node_a, "train", settle=False, using=interpreter)
    assert a["stats"]["misses"] == len(PROGRAMS) and a["stats"]["writes"] == len(PROGRAMS), a["stats"]
    assert a["local_dir"] == str(node_a / "unchecked") and a["cache_dir"] == root
    at_exit = final_record(gcs_client, gcs_bucket, a)["local"]
    assert at_exit["uploaded"] == len(PROGRAMS) and at_exit["upload_failed"] == at_exit["upload_pending"] == 0, at_exit
    stored = root_objects(gcs_client, gcs_bucket)
    written = entries(node_a / "unchecked")
    # What JAX wrote locally is in the root, byte for byte, with the writer's signature beside each entry.
    assert {k: v for k, v in stored.items() if k.endswith("-cache")} == written and len(written) == len(PROGRAMS)
    assert {signing.sig_name(k.removesuffix("-cache")) for k in written} <= set(stored)

    # Node B, empty, after node A's job exited: every program is a hit, fetched once when JAX asks (prefetch off
    # here; tests/test_prefetch.py fetches ahead), then read locally.
    b, _ = run_job(root, node_b, "train", using=interpreter, JAXCACHE_PREFETCH="0")
    assert b["stats"]["hits"] == len(PROGRAMS) and b["stats"]["misses"] == 0, b["stats"]
    assert b["local"]["fetched"] == len(PROGRAMS) and b["local"]["loaded"] == 0, b["local"]
    assert b["local"]["fetched_bytes"] == sum(len(v) for v in written.values())
    assert entries(node_b / "unchecked") == written
    assert "local tier" in b["summary"] and "4 fetched on demand" in b["summary"], b["summary"]
    again, _ = run_job(root, node_b, "train", using=interpreter)
    assert again["stats"]["hits"] == len(PROGRAMS) and again["local"]["loaded"] == len(PROGRAMS), again["local"]
    assert again["local"]["fetched"] == 0 and again["local"]["dropped"] == 0, again["local"]
    # JAX's own LRU runs on the local directory: each entry has its -atime file, under JAX's .lockfile.
    assert {p.name.removesuffix("-atime") for p in (node_b / "unchecked").glob("*-atime")} == {
        k.removesuffix("-cache") for k in written}
    assert oct((node_b / "unchecked").stat().st_mode & 0o777) == "0o700"
    # The CLI reads it like any root.
    capsys.readouterr()
    assert main(["ls", str(node_b / "unchecked"), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {e["key"] for e in listed["entries"]} == {k.removesuffix("-cache") for k in written}, listed
    assert main(["doctor", str(node_b / "unchecked")]) == 0, capsys.readouterr()

    # A job that checks signatures admits into a directory of its own, never one filled unchecked.
    signed, _ = run_job(root, node_b, "careful", "--verify", "signed", using=interpreter,
                        JAXCACHE_TRUSTED_KEYS=PUBLIC)
    assert signed["local_dir"].startswith(str(node_b / "signed-")), signed["local_dir"]
    assert signed["stats"]["hits"] == len(PROGRAMS) and signed["local"]["fetched"] == len(PROGRAMS)
    assert signed["skipped"] == {}
    assert entries(Path(signed["local_dir"])) == written


def test_a_prune_on_the_root_reaches_the_node_at_its_next_start(tmp_path, gcs_client, gcs_bucket):
    root = f"gs://{gcs_bucket}/jc"
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    run_job(root, node_a, "train")
    run_job(root, node_b, "train")
    local = node_b / "unchecked"
    (gram,) = [n for n in entries(local) if n.startswith("jit_gram-")]
    gcs_client.bucket(gcs_bucket).blob(f"jc/{gram}").delete()  # what a prune (or DELETE) does to the root
    # What a process killed mid-admission leaves: swept once old, left alone while another could be writing it.
    stale, fresh = local / ".jaxcache-tmp-stale", local / ".jaxcache-tmp-fresh"
    for path in (stale, fresh):
        path.write_bytes(b"half an entry")
    _age(stale)
    # A write JAX left torn in a process that died before its upload: old, it is removed, never uploaded.
    torn = "jit_torn-" + "0" * 64
    (local / f"{torn}-cache").write_bytes(b"\x28\xb5\x2f\xfd torn")
    (local / ".jaxcache" / "pending" / torn).write_bytes(b"")
    _age(local / f"{torn}-cache")

    b, _ = run_job(root, node_b, "train", "--programs", "affine,wave")
    assert not stale.exists() and fresh.exists()
    assert not (local / f"{torn}-cache").exists() and not (local / ".jaxcache" / "pending" / torn).exists()
    assert f"{torn}-cache" not in root_objects(gcs_client, gcs_bucket)
    assert b["local"]["dropped"] == 1 and b["local"]["loaded"] == 2, b["local"]
    assert gram not in entries(local) and not (local / gram.replace("-cache", "-atime")).exists()
    assert b["stats"]["hits"] == 2 and b["stats"]["misses"] == 0, b["stats"]


def test_a_signature_gone_from_the_root_reaches_a_checking_node_at_its_next_start(tmp_path, gcs_client, gcs_bucket):
    root = f"gs://{gcs_bucket}/jc"
    signed = ("--verify", "signed")
    run_job(root, tmp_path / "node-a", "train")  # signs what it writes (JAXCACHE_SIGNING_KEY)
    node_b = tmp_path / "node-b"
    first, _ = run_job(root, node_b, "careful", *signed, JAXCACHE_TRUSTED_KEYS=PUBLIC)
    local = Path(first["local_dir"])
    (wave,) = [n for n in entries(local) if n.startswith("jit_wave-")]
    key = wave.removesuffix("-cache")
    gcs_client.bucket(gcs_bucket).blob(f"jc/{signing.sig_name(key)}").delete()

    b, _ = run_job(root, node_b, "careful", *signed, JAXCACHE_TRUSTED_KEYS=PUBLIC)
    # Dropped at start, fetched again on JAX's lookup, refused as unsigned: compiled, as reading the root would.
    assert b["local"]["dropped"] == 1 and b["local"]["skipped"] == 1, b["local"]
    assert b["skipped"] == {key: skips.UNSIGNED}, b["skipped"]
    assert b["stats"]["hits"] == len(PROGRAMS) - 1 and b["stats"]["misses"] == 1, b["stats"]


def test_a_torn_download_never_becomes_a_file_jax_reads(tmp_path, faults, gcs_client, gcs_bucket):
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "node-a", "train")
    stored = {k: v for k, v in root_objects(gcs_client, gcs_bucket).items() if k.endswith("-cache")}
    (gram,) = [n for n in stored if n.startswith("jit_gram-")]
    (wave,) = [n for n in stored if n.startswith("jit_wave-")]
    # The root's wave entry is torn (half its bytes, as a writer that died mid-upload through another tool would
    # leave it); downloads of gram are cut off midway three times before one gets through.
    gcs_client.bucket(gcs_bucket).blob(f"jc/{wave}").upload_from_string(stored[wave][: len(stored[wave]) // 2])
    faults.tear(3, method="GET", path=rf"{gram}\?.*alt=media")

    node_b = tmp_path / "node-b"
    b, err = run_job(root, node_b, "train")
    local = entries(node_b / "unchecked")
    assert [e for e in faults.injected() if e[2] == "torn"] and faults.pending() == 0, faults.log
    assert local[gram] == stored[gram]  # the whole entry, after the library's retries
    assert "broken" in err and b["local"]["skipped"] == 1, (b["local"], err)
    # The torn wave entry never entered: JAX compiled it and keeps its own whole write.
    assert local[wave] != stored[wave][: len(stored[wave]) // 2]
    assert entry.validate(local[wave]).status is entry.Status.OK
    assert all(entry.validate(v).status is entry.Status.OK for v in local.values())
    assert not [p for p in (node_b / "unchecked").iterdir() if p.name.startswith(".jaxcache-tmp-")]
    assert b["stats"]["hits"] == len(PROGRAMS) - 1 and b["stats"]["misses"] == 1, b["stats"]


def test_upload_failures_never_fail_the_job(tmp_path, faults, gcs_client, gcs_bucket):
    root = f"gs://{gcs_bucket}/jc"
    node_a = tmp_path / "node-a"
    # Every upload of an entry is answered 503 (its name is in the upload's metadata); run records still go through.
    faults.fail(10_000, 503, method="POST", body=rb'-cache"')
    a, err = run_job(root, node_a, "train", settle=False, JAXCACHE_UPLOAD_WAIT_S="1")
    assert a["stats"]["writes"] == len(PROGRAMS), a["stats"]
    assert "did not finish" in err or "could not upload" in err, err
    assert not [k for k in root_objects(gcs_client, gcs_bucket) if k.endswith("-cache")]
    record = final_record(gcs_client, gcs_bucket, a)
    left = record["local"]["upload_pending"] + record["local"]["upload_failed"]
    assert record["local"]["uploaded"] == 0 and left >= 1, record["local"]
    assert len(os.listdir(node_a / "unchecked" / ".jaxcache" / "pending")) == len(PROGRAMS)

    # Once the root answers again, the node's next job uploads what the first one left, and node B hits it.
    faults.clear()
    again, _ = run_job(root, node_a, "train")
    assert again["stats"]["hits"] == len(PROGRAMS) and again["local"]["uploaded"] == len(PROGRAMS), again["local"]
    assert entries(node_a / "unchecked") == {
        k: v for k, v in root_objects(gcs_client, gcs_bucket).items() if k.endswith("-cache")}
    assert os.listdir(node_a / "unchecked" / ".jaxcache" / "pending") == []
    # On demand (prefetch off): the job's working set names these keys, and a prefetch would count them apart.
    b, _ = run_job(root, tmp_path / "node-b", "train", JAXCACHE_PREFETCH="0")
    assert b["stats"]["hits"] == len(PROGRAMS) and b["local"]["fetched"] == len(PROGRAMS), b["local"]


def test_the_cap_never_evicts_what_waits_for_its_upload(tmp_path, faults, gcs_client, gcs_bucket):
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "node-x", "other", "--programs", "wave,grad")
    node_a = tmp_path / "node-a"
    faults.fail(10_000, 503, method="POST", body=rb'-cache"')  # uploads of entries fail: node A's own stay pending
    run_job(root, node_a, "train", "--programs", "affine,gram", settle=False, JAXCACHE_UPLOAD_WAIT_S="1")
    own = set(entries(node_a / "unchecked"))
    assert len(own) == 2
    # A cap too small for anything: fetching the root's programs evicts all it may, and never an entry only this
    # node holds, which is still to reach the root.
    b, _ = run_job(root, node_a, "train", "--programs", "wave,grad", "--max-size-bytes", "1", settle=False,
                   JAXCACHE_UPLOAD_WAIT_S="1")
    assert b["stats"]["hits"] == 2 and b["local"]["fetched"] == 2 and b["local"]["evicted"] >= 1, b["local"]
    assert own <= set(entries(node_a / "unchecked"))
    faults.clear()
    again, _ = run_job(root, node_a, "train", "--programs", "affine,gram")
    assert again["local"]["uploaded"] == 2, again["local"]
    assert own <= set(root_objects(gcs_client, gcs_bucket))


def test_the_local_directory_stays_under_its_cap(tmp_path, gcs_client, gcs_bucket, interpreter):  # noqa: F811
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "node-a", "train", using=interpreter)  # keys are per JAX version
    sizes = sorted(len(v) for v in entries(tmp_path / "node-a" / "unchecked").values())
    cap = sizes[-1] + sizes[-2]  # room for two entries, never for all four
    node_b = tmp_path / "node-b"
    node_b.mkdir(mode=0o755)  # a folder of the user's keeps its mode; the tier's own subdirectory is private
    node_b.chmod(0o755)
    b, _ = run_job(root, node_b, "train", "--max-size-bytes", str(cap), using=interpreter)
    assert (node_b.stat().st_mode & 0o777, (node_b / "unchecked").stat().st_mode & 0o777) == (0o755, 0o700)
    assert b["stats"]["hits"] == len(PROGRAMS) and b["local"]["evicted"] >= 1, b["local"]
    kept = entries(node_b / "unchecked")
    assert sum(len(v) for v in kept.values()) <= cap and 1 <= len(kept) < len(PROGRAMS)
    assert {p.name.removesuffix("-atime") for p in (node_b / "unchecked").glob("*-atime")} == {
        k.removesuffix("-cache") for k in kept}


def test_no_writable_local_directory_means_reading_the_root_directly(tmp_path, gcs_client, gcs_bucket):
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "node-a", "train")
    # Tests run as root, whom permissions do not stop: files where the directories would go block them instead.
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "xdg").write_text("")
    (blocked / ".cache").write_text("")
    (blocked / "jaxcache-0").write_text("")
    (blocked / f"jaxcache-{os.getuid()}").write_text("")
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", root, "--job", "ro"], capture_output=True,
                          text=True, timeout=300, env=_env(XDG_CACHE_HOME=str(blocked / "xdg"), HOME=str(blocked),
                                                           TMPDIR=str(blocked)))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["local_dir"] is None and out["local"] is None
    assert out["stats"]["hits"] == len(PROGRAMS), out["stats"]
    assert proc.stderr.count("no node-local directory is writable") == 1, proc.stderr


def test_where_the_local_tier_goes(tmp_path):
    args = dict(job=None, min_compile_time_secs=None, min_entry_size_bytes=None, xla_caches=None, max_size_bytes=None,
                service_url=None, token=None, trust="strict", default_xla_caches="none")
    xdg = str(tmp_path / "xdg")
    remote = client_options.resolve("gs://bucket/jc", env={"XDG_CACHE_HOME": xdg}, **args)
    assert remote.local_dirs[0].startswith(os.path.join(xdg, "jaxcache", "local", ""))
    assert len(remote.local_dirs) >= 2  # then ~/.cache, then the temp dir
    other = client_options.resolve("gs://bucket/other", env={"XDG_CACHE_HOME": xdg}, **args)
    assert other.local_dirs[0] != remote.local_dirs[0]  # one directory per root
    assert client_options.resolve("gs://bucket/jc", env={"JAXCACHE_LOCAL_DIR": "off"}, **args).local_dirs == ()
    assert client_options.resolve(str(tmp_path), env={"XDG_CACHE_HOME": xdg}, **args).local_dirs == ()
    chosen = client_options.resolve(str(tmp_path / "root"), env={}, local_dir=tmp_path / "here", **args)
    assert chosen.local_dirs == (str(tmp_path / "here"),)
    # A gs:// root with a local tier has a size cap (JAX's LRU runs on the local directory); without one, none.
    assert remote.jax_settings(remote.local_dirs[0])["jax_compilation_cache_max_size"] == (
        client_options.DEFAULT_LOCAL_MAX_BYTES)
    assert "jax_compilation_cache_max_size" not in remote.jax_settings()
    with pytest.raises(InvalidInputError, match="directory on this node"):
        client_options.resolve("gs://bucket/jc", env={"JAXCACHE_LOCAL_DIR": "gs://other/x"}, **args)
    with pytest.raises(InvalidInputError, match="node-local tier"):
        client_options.resolve("gs://bucket/jc", env={"JAXCACHE_LOCAL_DIR": "off"}, **{**args, "max_size_bytes": 1})


def test_a_signed_nodes_own_unsigned_write_gives_way_to_a_signed_copy(tmp_path, gcs_client, gcs_bucket):
    """A verify='signed' job without a signing key keeps what it compiled locally, but as unverified: once the root
    holds a signed copy of the key, the node's next job drops its own and loads the signed one."""
    root = f"gs://{gcs_bucket}/jc"
    signed = ("--verify", "signed", "--programs", "affine")
    node_b = tmp_path / "node-b"
    first, _ = run_job(root, node_b, "careful", *signed, JAXCACHE_TRUSTED_KEYS=PUBLIC, JAXCACHE_SIGNING_KEY="")
    assert first["stats"]["writes"] == 1 and first["local"]["uploaded"] == 1, first
    local = Path(first["local_dir"])
    (name,) = entries(local)
    key = name.removesuffix("-cache")
    assert os.listdir(local / ".jaxcache" / "unverified") == [key]
    # The unsigned upload is removed from the root, and a writer with the key compiles and signs the program.
    gcs_client.bucket(gcs_bucket).blob(f"jc/{name}").delete()
    run_job(root, tmp_path / "node-a", "train", "--programs", "affine")
    assert signing.sig_name(key) in root_objects(gcs_client, gcs_bucket)

    # On demand (prefetch off): the signed copy is fetched when JAX asks, not raced in ahead of it.
    b, _ = run_job(root, node_b, "careful", *signed, JAXCACHE_TRUSTED_KEYS=PUBLIC, JAXCACHE_SIGNING_KEY="",
                   JAXCACHE_PREFETCH="0")
    assert b["local"]["dropped"] == 1 and b["local"]["fetched"] == 1 and b["local"]["loaded"] == 0, b["local"]
    assert b["stats"]["hits"] == 1 and b["skipped"] == {}, b
    assert entries(local) == {name: root_objects(gcs_client, gcs_bucket)[name]}
    assert os.listdir(local / ".jaxcache" / "unverified") == []


def test_what_the_service_judges_bad_leaves_an_attested_node_at_its_next_start(service, tmp_path):  # noqa: F811
    base, cache = service  # the real service over a local root (the tier works the same over any root)
    attested = ("--verify", "attested", "--service-url", base, "--token", REPORT)
    run_job(str(cache), "off", "writer")
    node = tmp_path / "node"
    first, _ = run_job(str(cache), node, "careful", *attested)
    assert first["local_dir"] == str(node / "attested") and first["local"]["fetched"] == len(PROGRAMS), first
    affine, gram = _entry(cache, "affine"), _entry(cache, "gram")
    gram.write_bytes(affine.read_bytes())  # planted in the root: another program's bytes under gram's key
    _age(gram)
    api(base, "/v1/caches/shared/rescan", ADMIN, "POST")
    api(base, "/v1/caches/shared/verify", ADMIN, "POST")
    key = gram.name.removesuffix("-cache")
    assert {p["key"] for p in api(base, "/v1/caches/shared/integrity")["problems"]} == {key}

    again, _ = run_job(str(cache), node, "careful", *attested)
    # The node's good copy goes too: the service's verdict is about the key, and the job compiles it.
    assert again["local"]["dropped"] == 1 and again["local"]["loaded"] == len(PROGRAMS) - 1, again["local"]
    assert set(again["skipped"]) == {key} and again["stats"]["misses"] == 1, again
    assert (node / "attested" / gram.name).read_bytes() != affine.read_bytes()


def test_a_root_that_refuses_the_listing_does_not_stop_the_node(tmp_path, faults, gcs_client, gcs_bucket):
    root = f"gs://{gcs_bucket}/jc"
    node = tmp_path / "node"
    run_job(root, node, "train")
    faults.fail(1000, 403, method="GET", path=r"/o\?")  # the job's identity may not list the bucket (any more)
    again, err = run_job(root, node, "train")
    assert "could not list the shared root" in err, err
    assert again["stats"]["hits"] == len(PROGRAMS) and again["local"]["loaded"] == len(PROGRAMS), again
    assert again["local"]["dropped"] == 0


def test_processes_on_one_node_share_its_directory(tmp_path, gcs_client, gcs_bucket):
    """Several processes start at once on an empty node: each program is fetched and admitted whole whoever wins,
    every process hits, and the directory ends with one whole entry (and its -atime file) per program."""
    root = f"gs://{gcs_bucket}/jc"
    run_job(root, tmp_path / "node-a", "train")
    node = tmp_path / "node"
    outs = run_together(root, node, [("--job", f"rank{i}") for i in range(3)])
    assert all(o["stats"]["hits"] == len(PROGRAMS) and o["stats"]["misses"] == 0 for o in outs), outs
    assert sum(o["local"]["fetched"] + o["local"]["loaded"] for o in outs) == len(PROGRAMS) * len(outs)
    stored = {k: v for k, v in root_objects(gcs_client, gcs_bucket).items() if k.endswith("-cache")}
    assert entries(node / "unchecked") == stored
    assert len(list((node / "unchecked").glob("*-atime"))) == len(PROGRAMS)
    assert not [p for p in (node / "unchecked").iterdir() if p.name.startswith(".jaxcache-tmp-")]
