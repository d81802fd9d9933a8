"""Packs (#71 item 4): a release's working set published into the root as one object, which a fleet's nodes seed their
tier from with a stat and a few ranged reads instead of a request per entry. Real jobs (tests/programs/client_job.py)
on an s3:// root on moto's S3 server, through the fault proxy (tests/store_faults.py), whose log of every request is
what is counted; the attacks are what anyone who can write the pack's object can do."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from jaxcache import packs, signing
from jaxcache.cli import main
from jaxcache.storage import open_storage
from store_faults import S3Faults
from test_bundles import members, write_tar
from test_client_service import PUBLIC
from test_decompression_bombs import zstd_bomb
from test_local_tier import PROGRAMS, _node_env, entries, run_job
from test_warmup import EXAMPLE, clean_env, warmup

pytestmark = pytest.mark.slow

PACK = "release-1"
SIGNED = {"JAXCACHE_VERIFY": "signed", "JAXCACHE_TRUSTED_KEYS": PUBLIC}


@pytest.fixture(scope="module")
def written(s3_client, tmp_path_factory) -> tuple[str, bytes]:
    """A bucket whose root ``jc`` one real job wrote (every entry signed by the ``writers`` key), and the pack of its
    working set as ``bundle export --pack`` publishes it."""
    bucket = f"packs-{os.urandom(4).hex()}"
    s3_client.create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/jc"
    out, _ = run_job(root, tmp_path_factory.mktemp("writer"), "train")
    assert out["local"]["uploaded"] == len(PROGRAMS), out["local"]
    assert main(["bundle", "export", root, "--job", "train", "--pack", PACK]) == 0
    data = s3_client.get_object(Bucket=bucket, Key=f"jc/{packs.object_name(PACK)}")["Body"].read()
    return bucket, data


@pytest.fixture
def root(written, s3_client, request) -> str:
    """A root of its own for the test: the written root's entries and signatures, and the pack."""
    bucket, pack = written
    prefix = f"t-{os.urandom(4).hex()}"
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="jc/")["Contents"]
    for obj in listed:
        name = obj["Key"].removeprefix("jc/")
        if name.endswith(("-cache", "-sig")):
            s3_client.copy_object(Bucket=bucket, Key=f"{prefix}/{name}",
                                  CopySource={"Bucket": bucket, "Key": obj["Key"]})
    put_pack(s3_client, f"s3://{bucket}/{prefix}", pack)
    return f"s3://{bucket}/{prefix}"


def put_pack(s3_client, root: str, data: bytes, name: str = PACK) -> None:
    bucket, _, prefix = root.removeprefix("s3://").partition("/")
    s3_client.put_object(Bucket=bucket, Key=f"{prefix}/{packs.object_name(name)}", Body=data)


def requests(log: list[tuple[str, str, int | str]]) -> Counter[str]:
    """The proxy's log by what was asked: ``pack HEAD``, ``pack GET``, ``entry HEAD``/``GET`` (an entry or its
    signature), ``list``, ``other PUT`` and so on."""
    found: Counter[str] = Counter()
    for method, raw, _status in log:
        split = urlsplit(raw)
        key = unquote(split.path).lstrip("/").partition("/")[2]
        if not key:
            what = "list" if "list-type" in parse_qs(split.query) else "other"
        elif key.endswith(packs.object_name(PACK)):
            what = "pack"
        elif key.endswith(("-cache", "-sig")):
            what = "entry"
        else:
            what = "other"
        found[f"{what} {method}" if what != "list" else what] += 1
    return found


def node_job(root: str, node: Path, s3_proxy: S3Faults, *args: str, **env: str) -> tuple[dict, str, Counter[str]]:
    """One job naming the pack on ``node``, through the proxy: its JSON line, its stderr, and what it asked the
    root."""
    s3_proxy.log.clear()
    out, err = run_job(root, node, "train", *args, JAXCACHE_PACK=PACK, AWS_ENDPOINT_URL=s3_proxy.url, **env)
    return out, err, requests(s3_proxy.log)


def tier_record(node: Path, policy: str = "unchecked") -> dict:
    return json.loads((node / policy / ".jaxcache" / "packs" / f"{PACK}.json").read_text())


def test_a_fresh_node_loads_every_program_from_the_pack_with_one_stat_and_its_ranged_reads(root, s3_proxy, tmp_path):
    node = tmp_path / "node"
    out, _, asked = node_job(root, node, s3_proxy)
    assert out["stats"]["hits"] == len(PROGRAMS) and out["stats"]["misses"] == 0, out["stats"]
    local = out["local"]
    assert local["loaded"] == len(PROGRAMS) and local["fetched"] == 0 and local["prefetched"] == len(PROGRAMS), local
    assert "seeded 4 entries" in out["summary"], out["summary"]
    # One stat of the pack and its one ranged read (a small pack); no entry asked about, no listing, no index read.
    assert (asked["pack HEAD"], asked["pack GET"]) == (1, 1), asked
    assert not asked["entry HEAD"] and not asked["entry GET"] and not asked["list"], asked
    assert sorted(tier_record(node)["keys"]) == sorted(k.removesuffix("-cache") for k in entries(node / "unchecked"))

    # The node's next start: the stat alone.
    again, _, asked = node_job(root, node, s3_proxy)
    assert again["stats"]["hits"] == len(PROGRAMS) and again["local"]["loaded"] == len(PROGRAMS), again
    assert "held already" in again["summary"], again["summary"]
    assert (asked["pack HEAD"], asked["pack GET"], asked["entry HEAD"], asked["entry GET"]) == (1, 0, 0, 0), asked


def seed(root: str, node: Path, s3_proxy: S3Faults, *args: str, **env: str) -> subprocess.CompletedProcess:
    s3_proxy.log.clear()
    return subprocess.run([sys.executable, "-m", "jaxcache", "tier", "seed", root, "--local-dir", str(node), *args],
                          capture_output=True, text=True, timeout=120,
                          env=_node_env(node, AWS_ENDPOINT_URL=s3_proxy.url, **env))


def test_jaxcache_tier_seed_seeds_a_node_before_its_jobs_land(root, s3_proxy, tmp_path):
    node = tmp_path / "node"
    done = seed(root, node, s3_proxy, "--pack", PACK, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    said = json.loads(done.stdout)
    assert (said["outcome"], said["entries"], said["directory"]) == ("seeded", len(PROGRAMS), str(node / "unchecked"))
    assert requests(s3_proxy.log)["pack GET"] == 1
    again = seed(root, node, s3_proxy, "--pack", PACK)
    assert again.returncode == 0 and "as it is now" in again.stdout and "nothing read" in again.stdout, again.stdout
    assert requests(s3_proxy.log) == Counter({"pack HEAD": 1}), s3_proxy.log
    out, _, asked = node_job(root, node, s3_proxy)
    assert out["stats"]["hits"] == len(PROGRAMS) and out["local"]["loaded"] == len(PROGRAMS), out
    assert (asked["pack HEAD"], asked["pack GET"], asked["entry HEAD"], asked["entry GET"]) == (1, 0, 0, 0), asked

    # Under the job's verify mode the seeder writes the directory that mode's jobs read, admitting what they would.
    signed = seed(root, node, s3_proxy, "--pack", PACK, "--verify", "signed", JAXCACHE_TRUSTED_KEYS=PUBLIC)
    assert signed.returncode == 0 and "signed-" in signed.stdout, signed.stdout + signed.stderr
    out, _, asked = node_job(root, node, s3_proxy, **SIGNED)
    assert out["stats"]["hits"] == len(PROGRAMS) and out["skipped"] == {}, out
    assert (asked["pack GET"], asked["entry HEAD"], asked["entry GET"]) == (0, 0, 0), asked

    missing = seed(root, node, s3_proxy, "--pack", "no-such-pack")
    assert missing.returncode == 1 and "no pack no-such-pack in" in missing.stdout, missing.stdout
    unnamed = seed(root, node, s3_proxy)
    assert unnamed.returncode == 2 and unnamed.stderr.count("\n") == 1 and "--pack NAME" in unnamed.stderr, unnamed
    bad = seed(root, node, s3_proxy, "--pack", "../x")
    assert bad.returncode == 2 and "pack name '../x'" in bad.stderr, bad.stderr


def tampered(pack: bytes, tmp_path: Path, attack: str) -> bytes:
    """The pack with one attack made on it (the manifest left as it was, unless the attack is in the bytes alone)."""
    items = members_of(pack, tmp_path)
    manifest = json.loads(items["manifest.json"])
    key = manifest["entries"][0]["key"]
    if attack == "a member's bytes changed":
        data = bytearray(items[f"{key}-cache"])
        data[len(data) // 2] ^= 0xFF
        items[f"{key}-cache"] = bytes(data)
    elif attack == "a member named ../x":
        items[f"../{key}-cache"] = items[f"{key}-cache"]
    elif attack == "a member the manifest does not list":
        items[f"jit_other-{'0' * 64}-cache"] = items[f"{key}-cache"]
    elif attack == "a decompression bomb":  # listed with its own digest and size: only its expansion gives it away
        bomb = zstd_bomb(16 << 30)
        items[f"{key}-cache"] = bomb
        manifest["entries"][0].update(sha256=hashlib.sha256(bomb).hexdigest(), size_bytes=len(bomb), signature=False)
        del items[f"{key}-sig"]
        items["manifest.json"] = json.dumps(manifest).encode()
    return write_tar(tmp_path / "tampered.tar", list(items.items())).read_bytes()


def members_of(pack: bytes, tmp_path: Path) -> dict[str, bytes]:
    path = tmp_path / "pack.tar"
    path.write_bytes(pack)
    return dict(members(path))


@pytest.mark.parametrize("attack", ["a member's bytes changed", "a member named ../x",
                                    "a member the manifest does not list", "a decompression bomb"])
def test_a_tampered_pack_is_refused_whole_and_the_job_runs_on(root, written, s3_proxy, tmp_path, s3_client, attack):
    put_pack(s3_client, root, tampered(written[1], tmp_path, attack))
    node = tmp_path / "node"
    out, err, asked = node_job(root, node, s3_proxy)
    # Nothing of the pack is used: the job fetches each program from the root, whose entries are whole.
    assert out["stats"]["hits"] == len(PROGRAMS) and out["local"]["fetched"] == len(PROGRAMS), out["local"]
    assert out["local"]["prefetched"] == 0 and "refused whole" in err, err
    assert tier_record(node)["refused"] and tier_record(node)["keys"] == []
    assert asked["pack GET"] == 1 and not list((node / "unchecked" / ".jaxcache" / "packs").glob(".download-*"))
    if attack == "a member's bytes changed":
        # Not read again while it is that version: the node's next start asks the stat alone of it.
        _, err, asked = node_job(root, node, s3_proxy)
        assert (asked["pack HEAD"], asked["pack GET"]) == (1, 0) and "refused whole" in err, asked


def test_a_replaced_pack_reseeds_and_its_copies_follow_the_pack_not_the_entries(root, written, s3_proxy, tmp_path,
                                                                                s3_client):
    items = members_of(written[1], tmp_path)
    manifest = json.loads(items["manifest.json"])
    first, second = manifest["entries"][:2], manifest["entries"][2:]
    manifest["entries"] = first
    half = {"manifest.json": json.dumps(manifest).encode(),
            **{f"{e['key']}{s}": items[f"{e['key']}{s}"] for e in first for s in ("-cache", "-sig")}}
    put_pack(s3_client, root, write_tar(tmp_path / "half.tar", list(half.items())).read_bytes())
    node = tmp_path / "node"
    out, _, asked = node_job(root, node, s3_proxy)
    assert out["stats"]["hits"] == len(PROGRAMS) and out["local"]["prefetched"] == 2, out["local"]
    assert out["local"]["fetched"] == 2 and asked["entry GET"] == 2, (out["local"], asked)  # the rest, on demand

    put_pack(s3_client, root, written[1])  # the next release: every program
    out, _, asked = node_job(root, node, s3_proxy)
    assert out["stats"]["hits"] == len(PROGRAMS) and out["local"]["loaded"] == len(PROGRAMS), out["local"]
    assert (asked["pack HEAD"], asked["pack GET"], asked["entry HEAD"], asked["entry GET"]) == (1, 1, 0, 0), asked
    assert len(tier_record(node)["keys"]) == len(PROGRAMS)

    # A prune of an entry in the root does not reach a copy its pack vouches for: the release is what the node holds.
    pruned = second[0]["key"]
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    s3_client.delete_object(Bucket=bucket, Key=f"{prefix}/{pruned}-cache")
    out, _, asked = node_job(root, node, s3_proxy)
    assert out["stats"]["hits"] == len(PROGRAMS) and out["local"]["dropped"] == 0, out["local"]
    assert asked["entry HEAD"] == asked["entry GET"] == 0, asked

    # The pack removed: its copies are checked against the root's entries as any copy, and the pruned one goes.
    s3_client.delete_object(Bucket=bucket, Key=f"{prefix}/{packs.object_name(PACK)}")
    out, err, asked = node_job(root, node, s3_proxy)
    assert out["stats"]["misses"] == 1 and out["local"]["dropped"] == 1, (out["stats"], out["local"])
    assert f"no longer has {pruned}" in err and "is not in" in err, err
    assert out["local"]["loaded"] == len(PROGRAMS) - 1, out["local"]
    # Copies seeded from the pack are compared by their bytes once (a GET), copies fetched before by a stat.
    assert asked["entry GET"] + asked["entry HEAD"] >= len(PROGRAMS), asked
    again, _, asked = node_job(root, node, s3_proxy)
    assert again["stats"]["hits"] == len(PROGRAMS), again["stats"]  # its own write, uploaded, is the root's now
    assert asked["entry GET"] == 0, asked  # checked once by their bytes: now copies of the root's objects


def test_a_lookup_fetches_its_entry_itself_when_the_pack_is_not_in_by_half_its_deadline(root, s3_proxy, tmp_path):
    """Another process of the node holds the pack's turn (it is reading a large pack): the job's lookups wait for the
    pack half their deadline, then fetch their entry themselves, rather than compile."""
    import filelock

    packs_dir = tmp_path / "node" / "unchecked" / ".jaxcache" / "packs"
    packs_dir.mkdir(parents=True, mode=0o700)
    for folder in (packs_dir, packs_dir.parent, packs_dir.parent.parent, packs_dir.parent.parent.parent):
        folder.chmod(0o700)
    with filelock.FileLock(str(packs_dir / f"{PACK}.lock")):
        s3_proxy.log.clear()
        out, _ = run_job(root, tmp_path / "node", "train", settle=False, JAXCACHE_PACK=PACK,
                         JAXCACHE_LOOKUP_DEADLINE_S="4", AWS_ENDPOINT_URL=s3_proxy.url)
    assert out["stats"]["hits"] == len(PROGRAMS) and out["stats"]["misses"] == 0, out["stats"]
    assert out["local"]["fetched"] == len(PROGRAMS) and out["local"]["prefetched"] == 0, out["local"]
    assert requests(s3_proxy.log)["pack GET"] == 0  # it never got the turn


def test_a_signed_node_admits_only_the_members_a_trusted_key_signed(root, written, s3_proxy, tmp_path, s3_client):
    items = members_of(written[1], tmp_path)
    manifest = json.loads(items["manifest.json"])
    unsigned = manifest["entries"][0]["key"]
    manifest["entries"][0]["signature"] = False
    del items[f"{unsigned}-sig"]
    items["manifest.json"] = json.dumps(manifest).encode()
    put_pack(s3_client, root, write_tar(tmp_path / "unsigned.tar", list(items.items())).read_bytes())
    node = tmp_path / "node"
    out, _, asked = node_job(root, node, s3_proxy, **SIGNED)
    assert out["local"]["prefetched"] == len(PROGRAMS) - 1, out["local"]
    policy = Path(out["local_dir"]).name
    assert unsigned not in tier_record(node, policy)["keys"]
    # The member left out is fetched from the root, where its signature is: it loads, checked as any entry.
    assert out["stats"]["hits"] == len(PROGRAMS) and out["local"]["fetched"] == 1 and out["skipped"] == {}, out

    # A signature the trusted key's name claims and another key made: forged, so the whole pack is refused.
    items = members_of(written[1], tmp_path)
    key = json.loads(items["manifest.json"])["entries"][1]["key"]
    forger = signing.new_key("writers", str(tmp_path / "forged.key"))
    data = items[f"{key}-cache"]
    items[f"{key}-sig"] = signing.encode([forger.sign(key, hashlib.sha256(data).hexdigest(), len(data))])
    put_pack(s3_client, root, write_tar(tmp_path / "forged.tar", list(items.items())).read_bytes())
    out, err, _ = node_job(root, tmp_path / "other", s3_proxy, **SIGNED)
    assert out["local"]["prefetched"] == 0 and "refused whole" in err and "bad signature" in err, err
    assert out["stats"]["hits"] == len(PROGRAMS) and out["skipped"] == {}, out


def test_download_reads_ranges_in_parallel_and_notices_a_pack_replaced_meanwhile(store_root, tmp_path):
    storage = open_storage(store_root, must_exist=False)
    data = os.urandom(40_000)
    storage.write_atomic("p.tar", data)
    asked: list[tuple[int, int]] = []
    path = tmp_path / "got"
    with open(path, "wb+") as f:
        heads: list[bytes] = []

        def read(offset: int, length: int) -> bytes | None:
            asked.append((offset, length))  # list.append is atomic: the ranges are read on several threads
            return storage.read_range("p.tar", offset, length)

        packs.download(read, len(data), f.fileno(), workers=4, chunk_bytes=4096, first=heads.append)
    assert path.read_bytes() == data and heads == [data[:4096]]
    assert sorted(asked) == [(o, min(4096, len(data) - o)) for o in range(0, len(data), 4096)]  # ceil(40,000/4,096)

    def replaced_after_the_first(offset: int, length: int) -> bytes | None:
        if offset == 0:
            storage.write_atomic("p.tar", data[:10_000])  # a new, smaller release lands meanwhile
        return storage.read_range("p.tar", offset, length)

    with open(path, "wb+") as f, pytest.raises(packs.PackChangedError):
        packs.download(replaced_after_the_first, len(data), f.fileno(), workers=4, chunk_bytes=4096)


def test_bundle_export_and_warmup_publish_packs(written, tmp_path, capsys, s3_client):
    bucket, pack = written
    capsys.readouterr()
    assert main(["bundle", "export", f"s3://{bucket}/jc", "--job", "train", "--pack", "r2", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["pack"] == "r2" and said["object"].endswith("/jc/.jaxcache/packs/r2.tar") and said["version"]
    assert said["path"] is None and len(said["keys"]) == len(PROGRAMS)
    assert main(["bundle", "export", f"s3://{bucket}/jc", "--job", "train", "--pack", "a/b"]) == 2
    assert "pack name 'a/b'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse's own refusal: one or the other
        main(["bundle", "export", f"s3://{bucket}/jc", "--job", "train", "--pack", "x", "-o", "y.tar"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err

    # The warm-up publishes what it stored: its coverage is the release's working set.
    cache = tmp_path / "c"
    args = ("--topology", "1x1x2", "--platform", "cpu", "--entrypoint", EXAMPLE, "--cache-dir", str(cache))
    out = json.loads(warmup(*args, "--pack", "warm", "--json").stdout)
    published = out["pack"]
    assert published["name"] == "warm" and published["entries"] == out["programs"] == 1, out
    listed = json.loads(dict(members(cache / packs.object_name("warm")))["manifest.json"])
    assert [e["key"] for e in listed["entries"]] == [k["key"] for k in out["keys"]]
    assert listed["warmups"] == [out["id"]]
    refused = warmup(*args, "--topology", "1x1x1", "--pack", "warm", expect=2)
    assert "--pack publishes one target's programs" in refused.stderr
    assert "pack name" in warmup(*args, "--pack", "a/b", expect=2).stderr


def test_a_job_naming_a_pack_needs_a_tier(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "from jaxcache.client import enable_cache; enable_cache()"],
                          capture_output=True, text=True, timeout=120,
                          env=clean_env(JAXCACHE_DIR=str(tmp_path), JAXCACHE_PACK=PACK, JAX_PLATFORMS="cpu"))
    assert proc.returncode != 0 and "seeds the node-local tier" in proc.stderr, proc.stderr
