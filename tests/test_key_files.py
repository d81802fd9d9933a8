"""A signing key file others may read, or anyone but its owner may write, is refused in one line by `keys sign` and
by jobs (#49 item 8): by its mode, by a POSIX ACL the mode does not show, or because another user owns it (#58 item
5). Group read stays allowed, and an owner root: a Kubernetes Secret mounted with `defaultMode: 0440` and an
`fsGroup` is how a non-root pod reads its key."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from jaxcache import signing
from jaxcache.client import options as client_options
from jaxcache.errors import InvalidInputError
from test_client_service import _env

JOB = Path(__file__).parent / "programs" / "client_job.py"
REFUSED = {0o644: "other users can read it", 0o604: "other users can read it",
           0o620: "users other than its owner can write it", 0o602: "users other than its owner can write it",
           0o660: "users other than its owner can write it"}
ALLOWED = (0o600, 0o400, 0o640, 0o440)


def key_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "writer.key"
    signing.new_key("writer", str(path))
    path.chmod(mode)
    return path


def test_keys_new_writes_a_key_only_its_owner_can_read(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "keys", "new", "ci", "--out", str(tmp_path / "ci.key")],
                          capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 0 and (tmp_path / "ci.key").stat().st_mode & 0o777 == 0o600, proc.stderr


@pytest.mark.parametrize("mode", sorted(REFUSED) + list(ALLOWED), ids=lambda m: f"{m:04o}")
def test_keys_sign_refuses_a_key_others_may_read_or_write(tmp_path, mode):
    root = tmp_path / "root"
    root.mkdir()
    path = key_file(tmp_path, mode)
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "keys", "sign", str(root), "--key", str(path)],
                          capture_output=True, text=True, timeout=60, env=_env())
    if mode in ALLOWED:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"mode {mode:04o}: {REFUSED[mode]}; run chmod 600 {path}" in proc.stderr, proc.stderr


def test_a_job_refuses_a_signing_key_others_can_read(tmp_path):
    path = key_file(tmp_path, 0o644)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", str(cache), "--job", "writer"],
                          capture_output=True, text=True, timeout=300, env=_env(JAXCACHE_SIGNING_KEY=str(path)))
    assert proc.returncode == 3, proc.stdout + proc.stderr  # enable_cache refused: nothing compiled or written
    assert f"JAXCACHE_SIGNING_KEY: the signing key {path} has mode 0644: other users can read it" in proc.stderr
    assert not any(cache.iterdir())


def keys_sign(tmp_path: Path, key: Path) -> subprocess.CompletedProcess:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "jaxcache", "keys", "sign", str(root), "--key", str(key)],
                          capture_output=True, text=True, timeout=60, env=_env())


def setfacl(path: Path, *args: str) -> None:
    tool = shutil.which("setfacl")
    if tool is None:
        pytest.skip("no setfacl (Debian's acl package, which `make test` installs as root or with sudo): the tests of"
                    " key files an ACL lets others read skip")
    proc = subprocess.run([tool, *args, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"this file system takes no ACLs: {proc.stderr.strip()}")


OTHER = 65534  # nobody, nogroup: neither the tests' user nor their group
ACL_REFUSED = {f"u:{OTHER}:r": "lets user", f"g:{OTHER}:r": "lets the group", f"u:{OTHER}:r,g:{OTHER}:r": "lets user"}


@pytest.mark.parametrize("entries", list(ACL_REFUSED))
def test_a_key_file_an_acl_lets_another_user_or_group_read_is_refused(tmp_path, entries):
    """Mode 0640 with an ACL entry for another user or group: the mode looks as allowed, the ACL is not."""
    path = key_file(tmp_path, 0o640)
    setfacl(path, "-m", entries)
    assert path.stat().st_mode & 0o777 == 0o640  # what the mode check alone saw
    proc = keys_sign(tmp_path, path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert ACL_REFUSED[entries] in proc.stderr and f"({OTHER}) read it" in proc.stderr, proc.stderr
    assert f"which its mode (0640) does not show; run setfacl -b {path}" in proc.stderr, proc.stderr
    setfacl(path, "-b")  # the command the line names
    assert keys_sign(tmp_path, path).returncode == 0


@pytest.mark.parametrize("entries", ["g:{gid}:r", "u:{uid}:r", f"u:{OTHER}:r,m::-"],
                         ids=["its own group named", "its owner named", "masked to nothing"])
def test_an_acl_that_adds_no_reader_is_allowed(tmp_path, entries):
    path = key_file(tmp_path, 0o640)
    setfacl(path, "-m", entries.format(uid=os.getuid(), gid=path.stat().st_gid))
    proc = keys_sign(tmp_path, path)
    assert proc.returncode == 0, proc.stderr


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a key file to another user and to read one as another user")


def test_a_key_file_another_user_owns_is_refused(tmp_path):
    """Its owner could rewrite it (with a key of their own), whatever its mode."""
    _need_root()
    path = key_file(tmp_path, 0o600)
    os.chown(path, OTHER, -1)
    proc = keys_sign(tmp_path, path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"({OTHER}), who could rewrite it; run chown root {path} as root" in proc.stderr, proc.stderr


# Read as deploy/k8s's pods read their Secret: a non-root user whose supplementary group (the pod's fsGroup) owns
# the file. The interpreter starts as root (its files are root's) and drops to that user before reading the key.
AS_POD = """
import os, sys
from jaxcache import signing
from jaxcache.errors import InvalidInputError
os.setgroups([int(sys.argv[2])])
os.setgid(int(sys.argv[3]))
os.setuid(int(sys.argv[3]))
try:
    print(signing.load_key(sys.argv[1]).name)
except InvalidInputError as exc:
    sys.exit(str(exc))
"""


@pytest.mark.parametrize(("owner", "loads"), [(0, True), (12345, False)], ids=["root", "another user"])
def test_a_secret_mounted_0440_with_an_fsgroup_is_read_when_root_owns_it(owner, loads):
    _need_root()
    fs_group, pod_user = 23456, OTHER
    mount = Path(tempfile.mkdtemp(prefix="jaxcache-secret-"))  # under /tmp: the pod's user must reach it
    try:
        os.chown(mount, 0, fs_group)
        mount.chmod(0o750)
        path = mount / "signing.key"
        signing.new_key("writer", str(path))
        os.chown(path, owner, fs_group)
        path.chmod(0o440)
        proc = subprocess.run([sys.executable, "-c", AS_POD, str(path), str(fs_group), str(pod_user)],
                              capture_output=True, text=True, timeout=60, env=_env())
    finally:
        shutil.rmtree(mount)
    if loads:
        assert proc.returncode == 0 and proc.stdout.strip() == "writer", proc.stderr
    else:
        assert proc.returncode == 1 and "is owned by user 12345, who could rewrite it" in proc.stderr, proc.stderr


_PUB = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="  # 32 bytes, base64
MALFORMED_TRUSTED = {
    "no colon": "writers",
    "not base64": "writers:not*base64",
    "url-safe base64": "writers:" + "-_" * 21 + "A=",  # 32 bytes to a URL-safe decoder, not base64
    "31 bytes": "writers:" + base64.b64encode(bytes(31)).decode(),
    "33 bytes": "writers:" + base64.b64encode(bytes(33)).decode(),
    "empty name": ":" + _PUB,
    "name with a slash": "../writers:" + _PUB,
    "a name twice": f"writers:{_PUB} writers:{base64.b64encode(bytes(32)).decode()}",
}


@pytest.mark.parametrize("value", list(MALFORMED_TRUSTED.values()), ids=list(MALFORMED_TRUSTED))
def test_a_malformed_trusted_key_is_refused_in_one_line(tmp_path, value):
    """The red team's 8 malformed JAXCACHE_TRUSTED_KEYS values, which held (#49): never read as a smaller set."""
    env = _env(JAXCACHE_TRUSTED_KEYS=value)
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "doctor", str(tmp_path), "--verify"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "JAXCACHE_TRUSTED_KEYS" in proc.stderr, proc.stderr
    serve = subprocess.run([str(Path(sys.executable).with_name("jaxcache")), "serve", "--cache", f"c={tmp_path}",
                            "--db", f"sqlite:///{tmp_path / 'c.sqlite'}"], capture_output=True, text=True, timeout=60,
                           env=env)
    assert serve.returncode == 2 and "Traceback" not in serve.stderr and "trusted" in serve.stderr.lower(), serve.stderr
    with pytest.raises(InvalidInputError, match="JAXCACHE_TRUSTED_KEYS"):
        client_options.resolve(str(tmp_path), env={"JAXCACHE_TRUSTED_KEYS": value}, job=None,
                               min_compile_time_secs=None, min_entry_size_bytes=None, xla_caches=None,
                               max_size_bytes=None, service_url=None, token=None, trust="off",
                               default_xla_caches="none", verify="signed")
