"""Shared fixtures: real JAX caches written by real compiles (the stores' servers: store_servers.py).

Caches are written in subprocesses (a fresh process per writer, so zstandard can be hidden for the zlib
writer and a second JAX version can be used) and are session-scoped to keep the suite fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock
import pytest

from ports import free_port

TESTS = Path(__file__).parent
# Fixtures that the tests of one subject share live beside them; this makes them visible to every test module.
pytest_plugins = ["dashboard_support", "deploy_support", "postgres_support", "reports_support", "screenshots_support",
                  "serving_support", "store_servers"]
WRITER = TESTS / "programs" / "jax_writer.py"
SHARED_FIXTURES = TESTS.parent.parent / "shared" / "fixtures"


# What the project keeps in the user's cache directory (the service's rescan snapshots, the CLI's head index) goes
# to a directory of this test run, never the developer's.
os.environ.setdefault("XDG_CACHE_HOME", tempfile.mkdtemp(prefix="jaxcache-tests-xdg-cache-"))


@pytest.fixture(scope="session", autouse=True)
def _head_index_dir(tmp_path_factory) -> Iterator[Path]:
    """`jaxcache ls`/`stats` keep a head index per root in the user's cache directory: in tests (and the CLI
    processes they start), a folder of the session's instead, so nothing is written under ~/.cache."""
    folder = tmp_path_factory.mktemp("head-index")
    old = os.environ.get("JAXCACHE_INDEX_DIR")
    os.environ["JAXCACHE_INDEX_DIR"] = str(folder)
    try:
        yield folder
    finally:
        if old is None:
            os.environ.pop("JAXCACHE_INDEX_DIR", None)
        else:
            os.environ["JAXCACHE_INDEX_DIR"] = old


@dataclass(frozen=True)
class WrittenCache:
    """A cache directory JAX wrote, with ground truth from JAX's own decoder."""

    root: str
    manifest: dict

    @property
    def entries(self) -> list[dict]:
        return self.manifest["entries"]


def run_writer(python: str, cache_dir: str, manifest: Path, *flags: str, env: dict | None = None) -> WrittenCache:
    """Run the standalone JAX writer under ``python`` and return what it wrote."""
    proc = subprocess.run(
        [python, str(WRITER), cache_dir, str(manifest), *flags],
        capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        raise AssertionError(f"JAX writer failed ({python}):\n{proc.stdout}\n{proc.stderr}")
    return WrittenCache(cache_dir, json.loads(manifest.read_text()))


def written_once(tmp_path_factory, name: str, python: str) -> dict[str, WrittenCache]:
    """The ``zstd`` and ``zlib`` caches of ``python``'s JAX, written once per test run: pytest-xdist's processes
    each have a session of their own, and the first to ask writes them (about 10 s of compiling each) for all, under
    a lock, in the run's folder above theirs. Tests only read them (they copy one to change it)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        base, lock = tmp_path_factory.mktemp(name), contextlib.nullcontext()
    else:
        run = tmp_path_factory.getbasetemp().parent
        base, lock = run / name, filelock.FileLock(str(run / f"{name}.lock"))
    flags = {"zstd": ("--lru",), "zlib": ("--no-zstd", "--lru")}
    with lock:
        if not (base / "written").exists():
            shutil.rmtree(base, ignore_errors=True)  # what a process that failed to write left
            base.mkdir(parents=True)
            for flavour, extra in flags.items():
                run_writer(python, str(base / flavour), base / f"{flavour}.json", *extra)
            (base / "written").touch()
    return {f: WrittenCache(str(base / f), json.loads((base / f"{f}.json").read_text())) for f in flags}


@pytest.fixture(scope="session")
def jax_caches(tmp_path_factory) -> dict[str, WrittenCache]:
    """Caches written by this interpreter's JAX: ``zstd`` (zstandard importable) and ``zlib`` (hidden)."""
    return written_once(tmp_path_factory, "jax-caches", sys.executable)


@pytest.fixture(scope="session")
def next_jax_caches(tmp_path_factory) -> dict[str, WrittenCache]:
    """The same caches written by a second JAX version (``make test`` builds that interpreter's venv)."""
    python = os.environ.get("JAXCACHE_NEXT_PYTHON", "")
    if not python or not os.path.exists(python):
        pytest.skip(
            "no second JAX interpreter: JAXCACHE_NEXT_PYTHON is unset or missing "
            "(`make test` builds .venv-jax-next when a working Python 3.12 exists)"
        )
    return written_once(tmp_path_factory, "next-jax-caches", python)


@pytest.fixture(scope="session")
def next_python_with_jaxcache() -> tuple[str, dict[str, str]]:
    """The second JAX interpreter and an environment in which it imports this checkout's core, client and warm-up.

    The parts' folders are source roots of the ``jaxcache`` namespace, so putting them on PYTHONPATH is all it
    takes (``make test`` also installs them there, in editable mode, for their dependencies).
    """
    python = os.environ.get("JAXCACHE_NEXT_PYTHON", "")
    if not python or not os.path.exists(python):
        pytest.skip(
            "no second JAX interpreter: JAXCACHE_NEXT_PYTHON is unset or missing "
            "(`make test` builds .venv-jax-next when a working Python 3.12 exists)"
        )
    repo = TESTS.parent
    return python, {"PYTHONPATH": os.pathsep.join(str(repo / part) for part in ("core", "client", "warmup"))}


def shared_fixture_dirs() -> list[Path]:
    """The team's fixture caches (JAX 0.10.2 and 0.12, zstd and zlib), if shared/ sits beside the checkout."""
    if not SHARED_FIXTURES.is_dir():
        return []
    return sorted(p for p in SHARED_FIXTURES.iterdir() if (p / "manifest.json").is_file())


@pytest.fixture
def index_dir(tmp_path, monkeypatch) -> Path:
    """A head index directory of the test's own (JAXCACHE_INDEX_DIR), the index on."""
    folder = tmp_path / "index"
    monkeypatch.setenv("JAXCACHE_INDEX_DIR", str(folder))
    monkeypatch.delenv("JAXCACHE_INDEX", raising=False)
    return folder


@pytest.fixture
def cache_copy(tmp_path, jax_caches) -> Path:
    """A writable copy of the zstd cache (with -atime files and JAX's .lockfile)."""
    dst = tmp_path / "cache"
    shutil.copytree(jax_caches["zstd"].root, dst)
    return dst


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """A small tmpfs mounted at ``path`` (a volume to fill up or unmount); skips where mounting is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (as in CI's container); run the suite as root to test full and "
                    "unmounted volumes")
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}): full and unmounted volumes go untested")
    try:
        yield path
    finally:
        if os.path.ismount(path):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


# --- fake-gcs-server -------------------------------------------------------------------------------------


def fake_entries(root: Path, n: int, *, age_days: float, tag: str = "fake") -> set[str]:
    """``n`` entries (-cache and -atime) named as JAX names them, in key order, created and last used ``age_days``
    ago; their bytes are not a program (a prune or a rescan does not care, and writing thousands of real ones would
    take minutes)."""
    at = time.time() - age_days * 86400
    keys = set()
    for i in range(n):
        key = f"jit_{tag}{i:05d}-{hashlib.sha256(f'{tag}{i}'.encode()).hexdigest()}"
        for suffix in ("-cache", "-atime"):
            path = root / f"{key}{suffix}"
            path.write_bytes(b"x" * 64)
            os.utime(path, (at, at))
        keys.add(key)
    return keys


def settled(client) -> None:
    """Wait until an in-process service (a TestClient's app) has finished its first round of background rescans:
    a round still to come would race the test's own changes to the cache (ingesting half of what it writes)."""
    state = client.app.state.jaxcache
    deadline = time.monotonic() + 120
    while state.loops.rescan_rounds < 1:
        assert time.monotonic() < deadline, "the first background rescan round never finished"
        time.sleep(0.02)


# --- `jaxcache serve` in its own process ----------------------------------------------------------------------


def serve_env(tokens: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """This process's environment without JAXCACHE_* settings, plus ``tokens`` (plain token -> scope, stored as
    the SHA-256 hashes the service expects) and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}
    if tokens:
        env["JAXCACHE_TOKENS"] = json.dumps({hashlib.sha256(t.encode()).hexdigest(): s for t, s in tokens.items()})
    return {**env, **extra}


def start_serve(caches: dict[str, str | Path], db: str | None, *, env: dict[str, str], args: tuple[str, ...] = (),
                stdout=subprocess.PIPE, exe: str | Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start `jaxcache serve` for ``caches`` (name -> root) on a free loopback port; returns the process and its
    base URL. Wait for it with :func:`wait_ready`, stop it with :func:`stop_serve`. ``exe``: another venv's
    `jaxcache` (default: this one's). ``db`` None: the catalog comes from ``env``'s JAXCACHE_DB."""
    port = free_port()
    exe = exe or Path(sys.executable).with_name("jaxcache")
    cmd = [str(exe), "serve", "--port", str(port), *(["--db", db] if db else []), *args]
    for name, root in caches.items():
        cmd += ["--cache", f"{name}={root}"]
    # A session of its own: kill_service() takes the serving process and its workers at once, as a node's death.
    proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def kill_service(proc: subprocess.Popen) -> None:
    """SIGKILL a `jaxcache serve` and its workers at once, as its node's death (or its container's) would."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_ready(proc: subprocess.Popen, base: str, *, output=None, patience_s: float = 60.0) -> None:
    """Wait until ``/readyz`` answers 200; raise with the process's output if it exits or never gets there.
    A bound on waiting for another process, not a timing assertion."""
    import httpx

    def said() -> str:
        return output() if output is not None else (proc.stdout.read() if proc.stdout else "")

    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"jaxcache serve exited:\n{said()}")
        try:
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"jaxcache serve never became ready:\n{said()}")


def stop_serve(proc: subprocess.Popen) -> None:
    """Ctrl-C, as a user stops it; kill if it does not exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def jaxcache_serve(caches: dict[str, str | Path], db: str, *, tokens: dict[str, str] | None = None,
                   args: tuple[str, ...] = (), **env: str) -> Iterator[str]:
    """A ready `jaxcache serve` over ``caches``; yields its base URL and stops it afterwards. ``env``: more
    variables for the service (JAXCACHE_TRUSTED_KEYS, ...)."""
    proc, base = start_serve(caches, db, env=serve_env(tokens, **env), args=args)
    try:
        wait_ready(proc, base)
        yield base
    finally:
        stop_serve(proc)


def upload_dir(client, bucket: str, prefix: str, src: str | Path) -> None:
    """Copy every file under ``src`` to ``gs://bucket/prefix/...``, keeping relative paths."""
    b = client.bucket(bucket)
    src = Path(src)
    for path in sorted(src.rglob("*")):
        if path.is_file():
            rel = path.relative_to(src).as_posix()
            b.blob(f"{prefix}/{rel}" if prefix else rel).upload_from_filename(str(path))
