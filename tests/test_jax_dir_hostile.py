"""What JAX's cache directory holds cannot stop a job (#58): a FIFO named like an entry, or like an entry's
``-atime`` with JAX's LRU on, in a directory root or in the node-local tier, is never waited on (a miss, with one
warning, and the job runs), and an entry left without its ``-atime`` in a directory root written with
``max_size_bytes`` is healed before JAX writes there. Real jobs (tests/programs/client_job.py), each bounded by a
timeout, so that a job that hangs fails the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_client_service import JOB, PUBLIC
from test_local_tier import PROGRAMS, _node_env, run_job
from test_verified_loads import _entry, interpreter  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow

HANG_S = 120  # a job takes seconds; one that waits on a FIFO waits for ever
LRU = ("--max-size-bytes", str(1 << 30))  # JAX's LRU on: its -atime files, its eviction inside each write


def bounded_job(root: Path, local: Path | str, *args: str, using: tuple[str, dict[str, str]] = (sys.executable, {}),
                **env: str) -> tuple[dict, str]:
    """One job on the interpreter and environment of ``using``, its JSON line and stderr; a job still running after
    :data:`HANG_S` fails the test."""
    python, extra = using
    try:
        proc = subprocess.run([python, str(JOB), "--cache-dir", str(root), "--job", "train", *args],
                              capture_output=True, text=True, timeout=HANG_S, env={**_node_env(local, **env), **extra})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the job hung on what the cache directory holds: still running after {exc.timeout} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def a_root(tmp_path: Path, *args: str, using: tuple[str, dict[str, str]] = (sys.executable, {}), **env: str) -> Path:
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    run_job(str(root), "off", "writer", *args, using=using, **env)  # keys are per JAX version
    return root


def test_a_fifo_entry_in_a_directory_root_is_a_miss_not_a_hang(tmp_path, interpreter):  # noqa: F811 - a fixture
    root = a_root(tmp_path, using=interpreter)
    gram = _entry(root, "gram")
    gram.unlink()
    os.mkfifo(gram)  # JAX's own read of it (exists, then open) would wait for a writer for ever
    out, err = bounded_job(root, "off", using=interpreter)
    assert out["stats"]["hits"] == len(PROGRAMS) - 1 and out["stats"]["misses"] == 1, out["stats"]
    assert err.count("is a FIFO, not a regular file: never opened") == 1, err
    # The same with the verify judge on JAX's reads: it judges what the client read, never opening the FIFO.
    signed, err = bounded_job(root, "off", "--verify", "signed", using=interpreter, JAXCACHE_TRUSTED_KEYS=PUBLIC)
    assert signed["stats"]["hits"] == len(PROGRAMS) - 1 and signed["skipped"] == {}, signed
    assert err.count("is a FIFO, not a regular file") == 1, err


def test_a_fifo_atime_in_a_directory_root_with_the_lru_on_is_never_waited_on(tmp_path, interpreter):  # noqa: F811
    """On every supported JAX: each has its own LRU code (jax 0.12's eviction counts a missing -atime as the oldest,
    but reads a FIFO as 0.10's does)."""
    root = a_root(tmp_path, "--programs", "affine,gram,grad", *LRU, using=interpreter)
    gram = _entry(root, "gram")
    atime = gram.with_name(gram.name.replace("-cache", "-atime"))
    atime.unlink()
    os.mkfifo(atime)  # JAX writes it on a hit of gram, and its eviction reads it inside every write
    out, err = bounded_job(root, "off", *LRU, using=interpreter)
    assert out["stats"]["hits"] == 3 and out["stats"]["writes"] == 1, (out["stats"], out["summary"])
    assert err.count("is a FIFO, not a regular file") == 1, err
    assert f"{gram.name.removesuffix('-cache')} (its -atime not a regular file: replaced)" in err, err
    assert atime.is_file() and len(atime.read_bytes()) == 8  # JAX's format: its eviction reads it again
    assert _entry(root, "wave").with_name(_entry(root, "wave").name.replace("-cache", "-atime")).is_file()


def test_a_fifo_atime_is_never_waited_on_with_the_lru_set_in_jax_itself(tmp_path):
    """JAX's LRU turned on by its own setting, not ``max_size_bytes``: the client keeps it all the same."""
    root = a_root(tmp_path, "--programs", "affine,gram", JAX_COMPILATION_CACHE_MAX_SIZE=str(1 << 30))
    gram = _entry(root, "gram")
    atime = gram.with_name(gram.name.replace("-cache", "-atime"))
    atime.unlink()
    os.mkfifo(atime)
    out, err = bounded_job(root, "off", "--programs", "gram,wave", JAX_COMPILATION_CACHE_MAX_SIZE=str(1 << 30))
    assert out["stats"]["hits"] == 1 and out["stats"]["writes"] == 1, (out["stats"], out["summary"])
    assert atime.is_file(), err


def test_a_fifo_in_the_node_local_tier_is_never_waited_on(tmp_path):
    root = a_root(tmp_path)
    node = tmp_path / "node"
    bounded_job(root, node)
    local = node / "unchecked"
    gram = _entry(local, "gram")
    gram.unlink()
    os.mkfifo(gram)
    out, err = bounded_job(root, node, JAXCACHE_PREFETCH="0")
    assert out["stats"]["hits"] == len(PROGRAMS), out["stats"]  # the root's entry, fetched again
    assert f"{gram.name.removesuffix('-cache')} (not a regular file: removed)" in out["summary"], out["summary"]
    assert gram.is_file() and gram.read_bytes() == _entry(root, "gram").read_bytes()


def test_an_entry_left_without_its_atime_in_a_directory_root_is_healed_before_jax_writes(tmp_path):
    root = a_root(tmp_path, "--programs", "affine,gram", *LRU)
    gram = _entry(root, "gram")
    key = gram.name.removesuffix("-cache")
    (root / f"{key}-atime").unlink()  # a kill between JAX's two writes, in another job on the root
    # Not looked up (a hit would write the -atime): unhealed, JAX 0.10's eviction fails on it in wave's write.
    out, err = bounded_job(root, "off", "--programs", "affine,wave", *LRU)
    assert out["stats"]["hits"] == 1 and out["stats"]["writes"] == 1, (out["stats"], out["summary"])
    assert "not written" not in out["summary"], out["summary"]
    assert f"{key} (its -atime written)" in err, err
    assert (root / f"{key}-atime").is_file() and _entry(root, "wave").is_file()
