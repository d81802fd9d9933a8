"""What a user names, planted or mistyped (#72 items 2, 5 and 6): every path judged as spelled before a link on it is
resolved (a cache root, a node-local tier, a key, a targets file, a bundle, a command's root), every number from a
flag, a variable or a setting in ASCII digits of bounded length, and every file a command reads regular, small and
quoted shortened, each refused in one line. Another local user's links are planted by root as ``nobody``."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxcache import signing
from jaxcache.client import check_cache_dir
from jaxcache.client import options as client_options
from jaxcache.client.errors import UntrustedCacheDirError
from jaxcache.errors import InvalidInputError
from jaxcache.storage.base import store_timeout_s
from jaxcache.warmup import targets
from test_client_service import KEY_PATH, _env
from test_local_tier import faults, root_objects, run_job  # noqa: F401 - a fixture
from test_tier_hostile import job, other_user, out_of
from test_warmup import EXAMPLE, warmup

BIG = "9" * 5000  # past Python's 4,300 digits of int()


def planted(link: Path, target: Path) -> Path:
    """A symbolic link at ``link`` to ``target`` that another local user owns (she can re-point it at will)."""
    uid, gid = other_user()
    link.symlink_to(target)
    os.lchown(link, uid, gid)
    return link


def shared_tmp(tmp_path: Path) -> Path:
    """A folder like /tmp: sticky and world-writable, where anyone may make a link."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def one_line(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The one line a refusal prints, short, and no traceback."""
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr and len(lines[0]) < 1200, proc.stderr[:3000]
    return lines[0]


def cli(*args: str, timeout: int = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jaxcache", *args], capture_output=True, text=True, timeout=timeout,
                          env=_env(**env))


def own_key(tmp_path: Path) -> Path:
    key = tmp_path / "writer.key"
    shutil.copy(KEY_PATH, key)
    key.chmod(0o600)
    return key


# --- item 2: paths judged as spelled ----------------------------------------------------------------------------


def test_a_cache_root_named_through_another_users_link_is_refused(tmp_path):
    """Her link to a directory that is this user's alone was followed, and the directory judged; now the path is
    judged as named: her link (or one of hers inside a link of ours, or a folder others can write on the way) refuses
    it, a job's and a warm-up's alike. A link of this user's (or root's) is followed, and JAX reads where it leads."""
    uid, _ = other_user()
    cache = tmp_path / "mine"
    cache.mkdir()
    shared = shared_tmp(tmp_path)
    link = planted(shared / "cache", cache)
    proc = job(str(link))
    assert proc.returncode == 3 and f"{link} is a symbolic link owned by uid {uid}" in proc.stderr, proc.stderr
    assert list(cache.iterdir()) == [], "nothing written through her link"
    (shared / "ours").symlink_to(link)  # ours, leading through hers
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o777)  # not sticky: anyone can swap the link of ours in it
    (team / "cache").symlink_to(cache)
    for named, why in ((link, f"{link} is a symbolic link owned by uid {uid}"),
                       (shared / "ours", f"{link} is a symbolic link owned by uid {uid}"),
                       (team / "cache", f"{team} is writable by its group and everyone")):
        with pytest.raises(UntrustedCacheDirError, match=why):
            check_cache_dir(named)
    assert check_cache_dir(str(link), trust="off") == str(cache)

    ours = shared / "link-of-mine"
    ours.symlink_to(cache)
    assert check_cache_dir(ours) == str(cache)
    out = out_of(job(str(ours)))
    assert out["cache_dir"] == str(cache) and list(cache.glob("*-cache")), out


@pytest.mark.gcs
def test_a_local_dir_named_through_another_users_link_is_refused(tmp_path, faults, gcs_client, gcs_bucket):  # noqa: F811
    """The issue's attack: JAXCACHE_LOCAL_DIR at her link to this user's tier of another cache, whose uploads are
    pending. The job loaded from that tier and uploaded the other job's pending entries into its own root; now it is
    refused before anything is made or read there."""
    uid, _ = other_user()
    c1, c2 = f"gs://{gcs_bucket}/c1", f"gs://{gcs_bucket}/c2"
    tier = tmp_path / "tier-of-c1"
    faults.fail(10_000, 503, method="POST", body=rb'-cache"')  # c1's uploads fail: its entries stay pending
    run_job(c1, tier, "train", settle=False, JAXCACHE_UPLOAD_WAIT_S="1")
    faults.clear()
    pending = tier / "unchecked" / ".jaxcache" / "pending"
    waiting = sorted(os.listdir(pending))
    assert waiting
    link = planted(shared_tmp(tmp_path) / "tier", tier)
    proc = job(c2, JAXCACHE_LOCAL_DIR=str(link))
    assert proc.returncode == 3 and f"{link} is a symbolic link owned by uid {uid}" in proc.stderr, proc.stderr
    assert root_objects(gcs_client, gcs_bucket, "c2") == {}, "nothing of c1's uploaded into c2"
    assert sorted(os.listdir(pending)) == waiting


def test_files_and_roots_named_through_another_users_link_are_refused(tmp_path):
    """A key file, a targets file, a bundle, a command's root and where a command writes (`keys new --out`,
    `bundle export -o`), named through her link: each refused in one line naming the link, nothing read or written.
    The same through a link of this user's is taken."""
    uid, _ = other_user()
    shared = shared_tmp(tmp_path)
    key, root = own_key(tmp_path), tmp_path / "root"
    root.mkdir()
    listed = tmp_path / "targets.txt"
    listed.write_text("1x1x1\n")
    their_key, their_list = planted(shared / "key", key), planted(shared / "targets", listed)
    their_root, their_dir = planted(shared / "root", root), planted(shared / "dir", tmp_path)
    said = f"is a symbolic link owned by uid {uid}"
    with pytest.raises(InvalidInputError, match=f"{their_key} {said}"):
        signing.key_from_env({signing.SIGNING_KEY_ENV: str(their_key)})
    with pytest.raises(InvalidInputError, match=f"{their_list} {said}"):
        targets.from_args(None, str(their_list), None)
    for args, link in ((("keys", "sign", str(root), "--key", str(their_key)), their_key),
                       (("ls", str(their_root)), their_root),
                       (("bundle", "import", str(shared / "dir" / "b.tar"), str(root)), their_dir),
                       (("bundle", "import", str(tmp_path / "b.tar"), str(their_root)), their_root),
                       (("bundle", "export", str(root), "--job", "j", "-o", str(their_dir / "out.tar")), their_dir),
                       (("keys", "new", "k2", "--out", str(their_dir / "k2.key")), their_dir)):
        assert f"{link} {said}" in one_line(cli(*args)), args
    assert not (tmp_path / "k2.key").exists() and not (tmp_path / "out.tar").exists()

    mine = shared / "mine"
    mine.symlink_to(tmp_path)
    assert signing.key_from_env({signing.SIGNING_KEY_ENV: str(mine / key.name)}) is not None
    assert targets.from_args(None, str(mine / listed.name), None) == ["1x1x1"]
    assert cli("ls", str(mine / "root")).returncode == 0


# --- item 5: numbers from input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", [f"1x1x{BIG}", f"{BIG}xv5e:16x16", f"v5e:{BIG}x16", f"v5e:4x4@{BIG}x1",
                                      "v5e:\u0662x\u0662", "1x1x\u0661"])
def test_a_topology_with_a_huge_or_foreign_number_is_one_line(tmp_path, topology, capsys):
    """`Exceeds the limit (4300 digits)` tracebacks, and `v5e:٢x٢` read as `v5e:2x2`: refused in one line, exit 2,
    quoting the start of what was given."""
    from jaxcache.warmup.cli import main

    assert main(["--topology", topology, "--cache-dir", str(tmp_path / "c"), "--platform", "tpu",
                 "--entrypoint", EXAMPLE, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "topolog" in err and len(err) < 1200 and "Traceback" not in err, err[:2000]
    assert not (tmp_path / "c").exists()


def test_numbers_from_flags_variables_and_settings_are_ascii_bounded_and_one_line(tmp_path, monkeypatch):
    """Other scripts' digits, inf, nan, 1e999 and 5,000 digits in a flag, a client variable or a service setting:
    refused in one line (they were taken as numbers, waited on for ever, or ended in a traceback)."""
    (tmp_path / "root").mkdir()
    for args in (["prune", str(tmp_path / "root"), "--max-size", "9" * 400],
                 ["ls", str(tmp_path / "root"), "--limit", "\u0661\u0662"],
                 ["bundle", "export", str(tmp_path / "root"), "--job", "j", "-o", "x", "--runs", BIG]):
        one_line(cli(*args))
    for name, value in (("JAXCACHE_UPLOAD_WAIT_S", "nan"), ("JAXCACHE_UPLOAD_WAIT_S", "inf"),
                        ("JAXCACHE_RECORD_EVERY_S", "1e999"), ("JAXCACHE_MIN_COMPILE_TIME_S", "\u0661"),
                        ("JAXCACHE_PREFETCH", "\u0668"), ("JAXCACHE_MIN_ENTRY_SIZE_BYTES", BIG),
                        ("JAXCACHE_LOOKUP_DEADLINE_S", "inf"), ("JAXCACHE_LOOKUP_DEADLINE_S", "\u0662")):
        with pytest.raises(InvalidInputError, match=name) as refused:
            client_options.resolve(str(tmp_path / "root"), env={name: value}, job=None, min_compile_time_secs=None,
                                   min_entry_size_bytes=None, xla_caches=None, max_size_bytes=None, service_url=None,
                                   token=None, trust="off", default_xla_caches="none")
        assert len(str(refused.value)) < 300
    for value in ("\u0662", "inf", BIG):  # a store's request timeout: float() took other scripts' digits
        monkeypatch.setenv("JAXCACHE_STORE_TIMEOUT_S", value)
        with pytest.raises(InvalidInputError, match="JAXCACHE_STORE_TIMEOUT_S"):
            store_timeout_s()
    monkeypatch.delenv("JAXCACHE_STORE_TIMEOUT_S")
    for value in ("inf", "1e12"):  # a wait past time_t raised inside the rescan loop
        serve = subprocess.run([str(Path(sys.executable).with_name("jaxcache")), "serve", "--cache",
                                f"c={tmp_path / 'root'}", "--db", f"sqlite:///{tmp_path / 'c.sqlite'}", "--rescan-s",
                                value], capture_output=True, text=True, timeout=60, env=_env())
        assert serve.returncode == 2 and "rescan" in serve.stderr and "Traceback" not in serve.stderr, serve.stderr


# --- item 6: files a user names ---------------------------------------------------------------------------------


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # /dev/zero read whole fails here, not the machine


def test_a_targets_key_or_tokens_file_that_is_no_small_regular_file_is_one_line(tmp_path):
    """A FIFO (which hung the command), /dev/zero (a MemoryError), a 2 MiB one-line file (read whole and echoed
    whole) and her link to a file only root may read (whose first line was printed): each refused in one line that
    quotes nothing of it. A key file and the service's tokens file are read by the same reader."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.txt"
    huge.write_text("v5e:" + "4" * (2 << 20) + "\n")
    secret = tmp_path / "secret"
    secret.write_text("hunter2-the-first-line\n")
    secret.chmod(0o600)
    theirs = planted(shared_tmp(tmp_path) / "secret", secret)
    for named, why in ((fifo, "is a FIFO, not a regular file"), ("/dev/zero", "is a device, not a regular file"),
                       (huge, "more than the 1048576 it may be"), (tmp_path, "is a directory, not a regular file"),
                       (theirs, "is a symbolic link owned by uid")):
        proc = subprocess.run([sys.executable, "-m", "jaxcache.warmup", "--targets", str(named), "--cache-dir",
                               str(tmp_path / "c"), "--platform", "cpu", "--entrypoint", EXAMPLE, "--dry-run"],
                              capture_output=True, text=True, timeout=60, env=_env(), preexec_fn=_limited)
        line = one_line(proc)
        assert why in line and "hunter2" not in line and "4444" not in line, line
    huge.write_text("v5e:" + "4" * 5000 + " # one long line\n")  # under the bound: the line is quoted shortened
    assert "... (" in one_line(warmup("--targets", str(huge), "--cache-dir", str(tmp_path / "c"), "--platform",
                                      "cpu", "--entrypoint", EXAMPLE, "--dry-run", expect=None, env=_env()))

    line = one_line(cli("keys", "sign", str(tmp_path), "--key", str(fifo)))
    assert "is a FIFO, not a regular file" in line, line
    job_proc = job(str(tmp_path / "cache"), JAXCACHE_SIGNING_KEY=str(fifo))
    assert job_proc.returncode == 3 and "is a FIFO" in job_proc.stderr, job_proc.stderr
    serve = subprocess.run([str(Path(sys.executable).with_name("jaxcache")), "serve", "--cache",
                            f"c={tmp_path / 'cache'}", "--db", f"sqlite:///{tmp_path / 'c.sqlite'}"],
                           capture_output=True, text=True, timeout=60, env=_env(JAXCACHE_TOKENS_FILE=str(fifo)))
    assert serve.returncode == 2 and "is a FIFO" in serve.stderr and "Traceback" not in serve.stderr, serve.stderr


def test_a_bundle_that_is_no_regular_file_is_refused_in_one_line(tmp_path):
    """Held before #72 (the bundle was stat'ed first), kept: a FIFO or a device named as the bundle is refused in one
    line and never opened in a way that waits; nothing is imported."""
    fifo = tmp_path / "b.tar"
    os.mkfifo(fifo)
    root = tmp_path / "root"
    for named in (fifo, Path("/dev/zero")):
        line = one_line(cli("bundle", "import", str(named), str(root)))
        assert f"the bundle {named} is " in line and "not a" in line, line
    assert not root.exists()
