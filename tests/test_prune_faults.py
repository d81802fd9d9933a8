"""Prune under faults: SIGKILLed half-way then run again, and racing live JAX jobs."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import termios
import time

import pytest

from jaxcache.cli import main
from jaxcache.prune import (
    Candidate,
    PrunePolicy,
    apply,
    plan,
)
from jaxcache.scan import scan
from jaxcache.storage import open_storage
from prune_support import (
    JOB,
    build_synthetic,
    small_sources,
    snapshot,
)

# --------------------------------------------------------------------------------------------------------------
# Crash safety: SIGKILL half-way, then run again


def _pipe_write_blocked(pid: int, read_fd: int, capacity: int) -> bool:
    """True once the process sleeps in a write to the (full) pipe."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if "pipe_write" in wchan:
        return True
    if wchan in ("", "0"):  # the kernel hides wchan: a sleeping writer with a full pipe is blocked on it
        pending = bytearray(4)
        fcntl.ioctl(read_fd, termios.FIONREAD, pending)
        return state == "S" and int.from_bytes(pending, sys.byteorder) > capacity - 512
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and F_SETPIPE_SZ (Linux)")
def test_prune_killed_half_way_then_rerun_ends_like_one_clean_run(tmp_path, cache_copy):
    now = time.time()
    sources = small_sources(cache_copy)
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    build_synthetic(crashed, sources, 3000, now)
    (crashed / ".lockfile").write_bytes(b"")  # as JAX's LRU leaves it: deletions take JAX's lock
    shutil.copytree(crashed, clean)
    total = sum(p.stat().st_size for p in crashed.iterdir() if p.name.endswith("-cache"))
    args = ["--unused-for", "20d", "--max-size", str(int(total * 0.35)), "--keep", f"{sources[0][0]}*",
            "--min-age", "10m"]

    assert main(["prune", str(clean), *args, "--apply"]) == 0
    expected = snapshot(clean)
    planned = 3000 - sum(1 for n in expected if n.endswith("-cache"))
    assert 1000 < planned < 3000 and any(n.startswith(sources[0][0]) for n in expected)

    read_fd, write_fd = os.pipe()
    capacity = fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 16384)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jaxcache", "prune", str(crashed), *args, "--apply", "-v"],
            stdout=subprocess.DEVNULL, stderr=write_fd,
        )
        os.close(write_fd)
        write_fd = -1
        # Never read the pipe: the child blocks in a write once it is full (after a whole entry was removed).
        deadline = time.monotonic() + 300
        while not _pipe_write_blocked(proc.pid, read_fd, capacity):
            assert proc.poll() is None, f"prune finished (rc {proc.returncode}) without filling the pipe"
            assert time.monotonic() < deadline, "prune never blocked on its stderr pipe"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    left = sum(1 for p in crashed.iterdir() if p.name.endswith("-cache"))
    assert 3000 - planned < left < 3000, "the kill should land after some but not all deletions"
    atimes = sum(1 for p in crashed.iterdir() if p.name.endswith("-atime"))
    assert atimes == left  # killed between entries, never between an entry's two files

    assert main(["prune", str(crashed), *args, "--apply"]) == 0
    assert snapshot(crashed) == expected


# --------------------------------------------------------------------------------------------------------------
# Prune racing live JAX jobs


@pytest.mark.slow
@pytest.mark.parametrize("lru", [False, True], ids=["plain", "jax-lru"])
def test_prune_racing_live_jobs_never_breaks_them(tmp_path, lru):
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    logs = []
    procs = []
    for i in range(10):
        out = open(tmp_path / f"job{i}.out", "w+")  # noqa: SIM115 - closed below
        logs.append(out)
        cmd = [sys.executable, str(JOB), str(cache), "--rounds", "3", *(["--lru"] if lru else [])]
        procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
    storage = open_storage(str(cache))
    policy = PrunePolicy(older_than_s=0, min_age_s=0)
    deleted_while_running = passes = 0
    try:
        while any(p.poll() is None for p in procs):
            p = plan([Candidate.from_record(r) for r in scan(storage, read_headers=False)], policy, now=time.time())
            result = apply(storage, p)
            assert not result.errors
            deleted_while_running += result.deleted
            passes += 1
            time.sleep(0.05)  # leave the two cores to the jobs
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = []
    for f in logs:
        f.seek(0)
        outputs.append(f.read())
        f.close()
    assert codes == [0] * 10, "\n---\n".join(outputs)
    assert all(o.rstrip().endswith("ok") for o in outputs)
    if lru:
        # Deletions take JAX's own LRU lock, so its eviction never trips over a half-deleted entry.
        assert not any("persistent compilation cache" in o for o in outputs), "\n---\n".join(outputs)
    final = apply(storage, plan([Candidate.from_record(r) for r in scan(storage)], policy, now=time.time()))
    assert passes > 0 and deleted_while_running + final.deleted > 0
    assert not [n for n in os.listdir(cache) if n.endswith(("-cache", "-atime"))]
