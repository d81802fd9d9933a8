"""Bundles (#36): `jaxcache bundle export` writes a job's working set as one archive, `jaxcache bundle import` checks
it whole and adds it create-only, and `warmup --check` reads one in place of a root. Entries are real: one job
writes (and signs) them once for the module; the attacks are what anyone who can hand over an archive can do."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from jaxcache import signing
from jaxcache.bundle_import import DIGESTS_ONLY
from jaxcache.cli import main
from test_client_service import PUBLIC
from test_local_tier import PROGRAMS
from test_local_tier import run_job as run_node_job
from test_verified_loads import run_job
from test_warmup import EXAMPLE, clean_env, warmup

MAIN = (sys.executable, {})
SIGNED_JOB = (sys.executable, {"JAXCACHE_TRUSTED_KEYS": PUBLIC})


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """A root one real job wrote, every entry signed by the `writers` key (PUBLIC)."""
    root = tmp_path_factory.mktemp("bundle-source") / "cache"
    root.mkdir(mode=0o700)
    out = run_job(MAIN, root, "train")
    assert out["stats"]["writes"] == len(PROGRAMS), out["stats"]
    return root


@pytest.fixture(scope="module")
def bundle(written, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bundle") / "train.tar"
    assert main(["bundle", "export", str(written), "--job", "train", "-o", str(path)]) == 0
    return path


@pytest.fixture(autouse=True)
def _no_trusted_keys(monkeypatch):
    monkeypatch.delenv(signing.TRUSTED_KEYS_ENV, raising=False)


def members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(i.name, tar.extractfile(i).read()) for i in tar]  # type: ignore[union-attr]


def write_tar(path: Path, items: list[tuple[str | tarfile.TarInfo, bytes]], *extra: tarfile.TarInfo,
              fmt: int = tarfile.PAX_FORMAT) -> Path:
    """An archive of ``items`` (a name, or a header of one's own making, and the bytes), then ``extra`` headers."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in items:
            info = name if isinstance(name, tarfile.TarInfo) else tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return path


def import_(capsys, path: Path, root: Path | str, *flags: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["bundle", "import", str(path), str(root), *flags])
    out = capsys.readouterr()
    return code, out.out, out.err


def objects(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


def test_export_writes_the_manifest_first_then_each_entry_and_its_signature(written, bundle):
    found = members(bundle)
    assert found[0][0] == "manifest.json"
    manifest = json.loads(found[0][1])
    assert manifest["schema"] == "jaxcache.bundle/1" and manifest["job"] == "train"
    assert manifest["source"] == str(written) and manifest["left_out"] == []
    fp = manifest["fingerprint"]
    assert (fp["backend"], fp["device_kind"], fp["device_count"]) == ("cpu", "cpu", 1) and fp["jaxlib"]
    entries = {e["key"]: e for e in manifest["entries"]}
    assert len(entries) == len(PROGRAMS)
    expected = []
    for key, e in entries.items():
        data = (written / f"{key}-cache").read_bytes()
        assert (e["sha256"], e["size_bytes"], e["signature"]) == (hashlib.sha256(data).hexdigest(), len(data), True)
        expected += [(f"{key}-cache", data), (f"{key}-sig", (written / f"{key}-sig").read_bytes())]
    assert found[1:] == expected


def test_export_leaves_out_what_it_cannot_vouch_for(written, tmp_path, capsys):
    root = shutil.copytree(written, tmp_path / "root")
    gram, wave = (next(root.glob(f"jit_{f}-*-cache")) for f in ("gram", "wave"))
    gram.write_bytes(gram.read_bytes()[:-10])  # no longer the bytes its writer recorded
    wave.unlink()
    out = tmp_path / "b.tar"
    assert main(["bundle", "export", str(root), "--job", "train", "-o", str(out), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    left = {x["key"]: x["why"] for x in answer["left_out"]}
    assert left[gram.name.removesuffix("-cache")].startswith("its bytes differ from the digest")
    assert left[wave.name.removesuffix("-cache")] == "gone from the root"
    assert len(answer["keys"]) == len(PROGRAMS) - 2 and answer["path"] == str(out)
    assert json.loads(members(out)[0][1])["left_out"] == answer["left_out"]

    # Nothing left to export: exit 1, no file. No such job: exit 2 (bad input), no file.
    for entry in root.glob("*-cache"):
        entry.unlink()
    assert main(["bundle", "export", str(root), "--job", "train", "-o", str(tmp_path / "none.tar")]) == 1
    assert "nothing written" in capsys.readouterr().out
    assert main(["bundle", "export", str(root), "--job", "nope", "-o", str(tmp_path / "none.tar")]) == 2
    assert "--job 'nope': no run or warm-up record" in capsys.readouterr().err
    # A near name is suggested, as `explain --job` does (#60); a job that ran, but not within --days, says so.
    assert main(["bundle", "export", str(root), "--job", "trian", "-o", str(tmp_path / "none.tar")]) == 2
    err = capsys.readouterr().err
    assert err.endswith("names that job; did you mean 'train'?\n") and err.count("\n") == 1, err
    assert main(["bundle", "export", str(root), "--job", "train", "--jaxlib", "0.0.1", "-o",
                 str(tmp_path / "none.tar")]) == 2
    assert "no working set for job 'train'" in capsys.readouterr().err
    assert not (tmp_path / "none.tar").exists() and not list(tmp_path.glob(".none.tar*"))


@pytest.mark.slow
def test_a_bundle_imported_into_a_fresh_root_serves_every_program(written, bundle, tmp_path, capsys):
    fresh = tmp_path / "image" / "cache"  # made by the import, as when baking an image
    code, out, _ = import_(capsys, bundle, fresh)
    assert code == 0, out
    assert DIGESTS_ONLY in out and f"{len(PROGRAMS)} imported" in out, out
    assert objects(fresh) == {k: v for k, v in objects(written).items() if k.endswith(("-cache", "-sig"))}
    job = run_job(MAIN, fresh, "train")
    assert job["stats"]["hits"] == len(PROGRAMS) and job["stats"]["misses"] == 0, job["stats"]
    careful = run_job(SIGNED_JOB, fresh, "careful", "--verify", "signed")  # the signatures came along
    assert careful["skipped"] == {} and careful["stats"]["hits"] == len(PROGRAMS), careful["stats"]
    code, out, _ = import_(capsys, bundle, fresh)
    assert code == 0 and f"0 imported, {len(PROGRAMS)} already there" in out, out


@pytest.mark.slow
def test_a_bundle_imported_into_an_object_store_serves_every_program(bundle, tmp_path, capsys, store_root,
                                                                     monkeypatch):
    from store_servers import raw_names

    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, PUBLIC)
    root = store_root
    code, out, _ = import_(capsys, bundle, root)
    assert code == 0, out
    assert f"checked against {signing.TRUSTED_KEYS_ENV} (writers)" in out and DIGESTS_ONLY not in out, out
    stored = raw_names(root)
    assert len(stored) == 2 * len(PROGRAMS), stored
    job, _ = run_node_job(root, tmp_path / "node", "train", "--verify", "signed", JAXCACHE_TRUSTED_KEYS=PUBLIC)
    assert job["stats"]["hits"] == len(PROGRAMS) and job["stats"]["misses"] == 0, job["stats"]
    assert job["skipped"] == {}


def _tampered(bundle: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The bundle with one entry's bytes altered, one signed by a rogue key, one without its signature."""
    items = dict(members(bundle))
    manifest = json.loads(items["manifest.json"])
    keys = [e["key"] for e in manifest["entries"]]
    altered, rogue_signed, unsigned, _ = keys
    data = bytearray(items[f"{altered}-cache"])
    data[len(data) // 2] ^= 0xFF
    items[f"{altered}-cache"] = bytes(data)
    rogue = signing.new_key("rogue", str(tmp_path / "rogue.key"))
    good = items[f"{rogue_signed}-cache"]
    items[f"{rogue_signed}-sig"] = signing.encode([rogue.sign(rogue_signed, hashlib.sha256(good).hexdigest(),
                                                              len(good))])
    del items[f"{unsigned}-sig"]
    for e in manifest["entries"]:
        e["signature"] = e["key"] != unsigned
    items["manifest.json"] = json.dumps(manifest).encode()
    path = write_tar(tmp_path / "tampered.tar", list(items.items()))
    return path, {"altered": altered, "rogue": rogue_signed, "unsigned": unsigned, "intact": keys[3]}


def test_with_trusted_keys_an_entry_needs_a_trusted_signature_over_its_bytes(bundle, tmp_path, capsys, monkeypatch):
    path, k = _tampered(bundle, tmp_path)
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, PUBLIC)
    code, out, _ = import_(capsys, path, tmp_path / "root", "--json")
    answer = json.loads(out)
    assert code == 1 and answer["check"] == "signatures" and answer["trusted_keys"] == ["writers"]
    assert {r["key"]: r["why"] for r in answer["refused"]} == {
        k["altered"]: "digest differs", k["rogue"]: "untrusted key", k["unsigned"]: "unsigned"}
    assert answer["imported"] == [k["intact"]]
    assert set(objects(tmp_path / "root")) == {f"{k['intact']}-cache", f"{k['intact']}-sig"}
    code, out, _ = import_(capsys, path, tmp_path / "again")
    assert f"refused {k['rogue']}: untrusted key" in out and "checked against JAXCACHE_TRUSTED_KEYS" in out, out


def test_a_signature_that_does_not_verify_is_refused_as_bad(bundle, tmp_path, capsys, monkeypatch):
    """A -sig that names a trusted key but was made with another: the bytes are right, the proof is forged."""
    items = dict(members(bundle))
    key, *rest = [e["key"] for e in json.loads(items["manifest.json"])["entries"]]
    forger = signing.new_key("writers", str(tmp_path / "forged.key"))  # the trusted key's name, another key
    data = items[f"{key}-cache"]
    items[f"{key}-sig"] = signing.encode([forger.sign(key, hashlib.sha256(data).hexdigest(), len(data))])
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, PUBLIC)
    code, out, _ = import_(capsys, write_tar(tmp_path / "forged.tar", list(items.items())), tmp_path / "root", "--json")
    answer = json.loads(out)
    assert code == 1 and answer["refused"] == [{"key": key, "why": "bad signature"}], answer
    assert answer["imported"] == rest


def test_without_trusted_keys_the_digests_are_checked_and_the_output_says_so(bundle, tmp_path, capsys):
    path, k = _tampered(bundle, tmp_path)
    code, out, _ = import_(capsys, path, tmp_path / "root")
    assert code == 1 and out.startswith(DIGESTS_ONLY), out
    assert f"refused {k['altered']}: its bytes differ from the manifest's digest" in out
    assert f"{k['altered']}-cache" not in objects(tmp_path / "root")
    assert f"{k['unsigned']}-cache" in objects(tmp_path / "root")


def _symlink(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


@pytest.mark.parametrize("attack", ["parent path", "symlink", "unlisted", "manifest not first", "not a tar"])
def test_a_hostile_archive_is_refused_whole_writing_nothing(bundle, tmp_path, capsys, attack):
    items = members(bundle)
    key = json.loads(items[0][1])["entries"][0]["key"]
    path, extra = tmp_path / "hostile.tar", []
    if attack == "parent path":
        items.append((f"../{key}-cache", items[1][1]))
    elif attack == "symlink":
        items = [i for i in items if i[0] != f"{key}-cache"]
        extra.append(_symlink(f"{key}-cache"))
    elif attack == "unlisted":
        items.append((f"jit_other-{'0' * 64}-cache", items[1][1]))
    elif attack == "manifest not first":
        items = items[1:] + items[:1]
    write_tar(path, items, *extra)
    if attack == "not a tar":
        path.write_bytes(b"\x28\xb5\x2f\xfd" + bundle.read_bytes())
    code, out, err = import_(capsys, path, tmp_path / "root")
    assert code == 2 and out == "", out
    assert err.startswith("jaxcache: error: ") and err.count("\n") == 1 and "nothing was imported" in err, err
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("cut", ["in the manifest", "in an entry", "after an entry", "in the last member"])
def test_a_truncated_archive_is_a_clear_error_and_leaves_the_root_as_it_was(bundle, tmp_path, capsys, cut):
    data = bundle.read_bytes()
    with tarfile.open(bundle) as tar:
        found = tar.getmembers()
    at = {"in the manifest": found[0].offset_data + 10, "in an entry": found[1].offset_data + found[1].size // 2,
          # exactly after the first entry: a tar reader alone would see a shorter, whole archive
          "after an entry": found[1].offset_data + -(-found[1].size // 512) * 512,
          "in the last member": found[-1].offset_data + found[-1].size - 1}[cut]
    short = tmp_path / "short.tar"
    short.write_bytes(data[:at])
    root = tmp_path / "root"
    root.mkdir()
    (root / "kept.txt").write_text("before")
    code, _, err = import_(capsys, short, root)
    assert code == 2 and ("truncated" in err or "not a whole" in err) and err.count("\n") == 1, err
    assert objects(root) == {"kept.txt": b"before"}


def test_an_object_already_in_the_root_is_never_overwritten(bundle, tmp_path, capsys):
    items = dict(members(bundle))
    keys = [e["key"] for e in json.loads(items["manifest.json"])["entries"]]
    root = tmp_path / "root"
    root.mkdir()
    other = items[f"{keys[1]}-cache"]
    (root / f"{keys[0]}-cache").write_bytes(other)  # another program's bytes under this key
    (root / f"{keys[2]}-cache").write_bytes(items[f"{keys[2]}-cache"])  # the same bytes: already there
    code, out, _ = import_(capsys, bundle, root, "--json")
    answer = json.loads(out)
    assert code == 1 and [x["key"] for x in answer["kept"]] == [keys[0]], answer
    assert "other bytes" in answer["kept"][0]["why"] and keys[2] in answer["present"]
    assert set(answer["imported"]) == {keys[1], keys[3]}
    assert (root / f"{keys[0]}-cache").read_bytes() == other
    assert not (root / f"{keys[0]}-sig").exists()  # its signature is of bytes the root does not hold


@pytest.mark.slow
def test_warmup_check_reads_a_bundle_in_place_of_a_root(tmp_path):
    cache = tmp_path / "c"
    args = ("--topology", "1x1x2", "--platform", "cpu", "--entrypoint", EXAMPLE)
    warmup(*args, "--cache-dir", str(cache))  # unsigned: no signing key
    path = tmp_path / "warm.tar"
    assert main(["bundle", "export", str(cache), "--job", "warmup", "-o", str(path)]) == 0
    out = json.loads(warmup(*args, "--cache-dir", str(path), "--check", "--json").stdout)
    assert (out["hits"], out["programs"], out["cache_dir"]) == (1, 1, str(path))
    assert out["bundle"]["check"] == "digests" and len(out["bundle"]["imported"]) == 1
    text = warmup(*args, "--cache-dir", str(path), "--check").stdout
    assert f"bundle {path} imported into a temporary directory" in text and DIGESTS_ONLY in text, text
    # A node that trusts only signed entries: the unsigned entry is refused on import, so the program misses.
    trusted = signing.new_key("ci", str(tmp_path / "ci.key")).public_text()
    node = clean_env(JAXCACHE_TRUSTED_KEYS=trusted)
    out = json.loads(warmup(*args, "--cache-dir", str(path), "--check", "--json", expect=1, env=node).stdout)
    assert out["hits"] == 0 and [r["why"] for r in out["bundle"]["refused"]] == ["unsigned"], out
    refused = warmup(*args, "--cache-dir", str(path), expect=2)  # only --check takes a bundle
    assert "only --check takes a bundle" in refused.stderr


def test_a_signature_that_could_not_be_placed_exits_1_and_names_the_entry(bundle, tmp_path, capsys):
    """Another ``-sig`` already in the root (from another signer) is left alone: the entry is there, but a job that
    trusts only this bundle's signer would skip it, so the import is not whole (#49 item 9)."""
    items = dict(members(bundle))
    keys = [e["key"] for e in json.loads(items["manifest.json"])["entries"]]
    root = tmp_path / "root"
    root.mkdir()
    other = signing.new_key("other", str(tmp_path / "other.key"))
    data = items[f"{keys[0]}-cache"]
    theirs = signing.encode([other.sign(keys[0], hashlib.sha256(data).hexdigest(), len(data))])
    (root / f"{keys[0]}-sig").write_bytes(theirs)
    code, out, _ = import_(capsys, bundle, root, "--json")
    answer = json.loads(out)
    assert code == 1 and set(answer["imported"]) == set(keys), answer
    assert [x["key"] for x in answer["signatures_left_alone"]] == [keys[0]], answer
    assert (root / f"{keys[0]}-sig").read_bytes() == theirs and (root / f"{keys[0]}-cache").read_bytes() == data
    code, out, _ = import_(capsys, bundle, root)  # again, in words: the entries are there, the signature is not
    assert code == 1 and f"signature not placed for {keys[0]}: the root holds another {keys[0]}-sig" in out, out
    assert "1 without this bundle's signature" in out, out


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


SPECIAL = {"hard link": tarfile.LNKTYPE, "folder": tarfile.DIRTYPE, "fifo": tarfile.FIFOTYPE,
           "character device": tarfile.CHRTYPE}


@pytest.mark.parametrize("attack", ["absolute path", "hard link", "folder", "fifo", "character device",
                                    "pax long name", "gnu long name", "entry twice", "signature twice",
                                    "manifest twice", "contiguous file", "./ entry", "./ signature", "./ manifest",
                                    "symlink signature", "hard link signature", "fifo signature"])
def test_more_hostile_archives_are_refused_whole_writing_nothing(bundle, tmp_path, capsys, attack):
    """The red team's structure attacks that held (#49, and #58's member tricks), kept: each refuses the whole
    archive in one line."""
    items = members(bundle)
    key = json.loads(items[0][1])["entries"][0]["key"]
    entry = dict(items)[f"{key}-cache"]
    escaping = f"../{'deep/' * 30}{key}-cache"  # past 100 characters: a PAX or GNU long-name header carries it
    extra: list[tarfile.TarInfo] = []
    fmt = tarfile.GNU_FORMAT if attack == "gnu long name" else tarfile.PAX_FORMAT
    if attack == "absolute path":
        items.append((f"/tmp/{key}-cache", entry))
    elif attack in ("pax long name", "gnu long name"):
        items.append((escaping, entry))
    elif attack == "entry twice":
        items.append((f"{key}-cache", entry))
    elif attack == "signature twice":
        items.append((f"{key}-sig", dict(items)[f"{key}-sig"]))
    elif attack == "manifest twice":
        items.append(items[0])
    elif attack == "contiguous file":  # a regular file's bytes, under a type tar readers take for one
        items = [(_special(n, tarfile.CONTTYPE) if n == f"{key}-cache" else n, d) for n, d in items]
    elif attack.startswith("./ "):  # the same member, under another spelling of its name
        named = {"entry": f"{key}-cache", "signature": f"{key}-sig", "manifest": "manifest.json"}[attack[3:]]
        items = [(f"./{n}" if n == named else n, d) for n, d in items]
    elif attack.endswith(" signature"):  # the entry's -sig member a link (to the entry: it would "sign" itself)
        items = [i for i in items if i[0] != f"{key}-sig"]
        kind = {"symlink": tarfile.SYMTYPE, "hard link": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[
            attack.removesuffix(" signature")]
        extra.append(_special(f"{key}-sig", kind, f"{key}-cache" if kind != tarfile.FIFOTYPE else ""))
    else:
        items = [i for i in items if i[0] != f"{key}-cache"]
        kind = SPECIAL[attack]
        extra.append(_special(f"{key}-cache", kind, "manifest.json" if kind == tarfile.LNKTYPE else ""))
    path = write_tar(tmp_path / "hostile.tar", items, *extra, fmt=fmt)
    if "long name" in attack:
        with tarfile.open(path) as tar:
            assert escaping in tar.getnames()  # the long name really is in the archive, as its header says
    code, out, err = import_(capsys, path, tmp_path / "root")
    assert code == 2 and out == "", out
    assert err.startswith("jaxcache: error: ") and err.count("\n") == 1 and "nothing was imported" in err, err
    assert not (tmp_path / "root").exists()


PAX_SIZES = {  # the size a PAX header gives the first entry, which its ustar header says is len(data)
    "zero": lambda n: 0, "one byte less": lambda n: n - 1, "one block more": lambda n: n + 512,
    "past the archive's end": lambda n: 1 << 40, "not a number": lambda n: "many",
}


@pytest.mark.parametrize("size", list(PAX_SIZES))
def test_a_pax_size_that_overrides_the_header_never_imports_other_bytes(bundle, tmp_path, capsys, size):
    """A PAX ``size`` record that disagrees with the member's ustar header (#58): the archive is read as one reader
    reads it, for the check and for the write; what it then holds is refused, whole when its structure breaks, or
    that entry alone when its bytes are not the manifest's. Never another member's bytes, nor a member cut short."""
    items = members(bundle)
    key = json.loads(items[0][1])["entries"][0]["key"]
    data = dict(items)[f"{key}-cache"]
    info = tarfile.TarInfo(f"{key}-cache")
    info.pax_headers = {"size": str(PAX_SIZES[size](len(data)))}
    path = write_tar(tmp_path / "pax.tar", [(info if n == f"{key}-cache" else n, d) for n, d in items])
    code, out, err = import_(capsys, path, tmp_path / "root", "--json")
    if size == "one byte less":  # within the same 512-byte blocks: a member one byte short, refused as such
        answer = json.loads(out)
        assert code == 1 and answer["refused"] == [
            {"key": key, "why": f"{len(data) - 1} bytes, where the manifest says {len(data)}"}], answer
        assert not (tmp_path / "root" / f"{key}-cache").exists() and len(answer["imported"]) == len(PROGRAMS) - 1
    else:
        assert code == 2 and out == "" and err.count("\n") == 1 and "nothing was imported" in err, (out, err)
        assert not (tmp_path / "root").exists()


def test_names_from_a_bundle_are_shown_escaped(bundle, tmp_path, capsys):
    """#49: a bundle's job, source and keys come from whoever made it; import lists them with bidirectional and
    zero-width characters escaped, as every other listing does."""
    items = dict(members(bundle))
    manifest = json.loads(items["manifest.json"])
    key = manifest["entries"][0]["key"]
    hostile = "jit_\u202eevil\u202d-" + key.rsplit("-", 1)[1]
    data = bytearray(items.pop(f"{key}-cache"))
    data[len(data) // 2] ^= 0xFF  # refused: its bytes differ from the manifest's digest
    items[f"{hostile}-cache"] = bytes(data)
    items[f"{hostile}-sig"] = items.pop(f"{key}-sig")
    manifest["entries"][0]["key"] = hostile
    manifest["job"], manifest["source"] = "tr\u200bain", "/data/\u202ecache"
    items["manifest.json"] = json.dumps(manifest).encode()
    path = write_tar(tmp_path / "hostile.tar", list(items.items()))
    code, out, _ = import_(capsys, path, tmp_path / "root")
    assert code == 1, out
    assert "refused jit_\\u202eevil\\u202d-" in out and "job 'tr\\u200bain'" in out and "/data/\\u202ecache" in out
    assert not {"\u202e", "\u202d", "\u200b"} & set(out), out
