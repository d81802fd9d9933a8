"""Each target's warm-up in a process of its own (JAX's configuration belongs to the process), N at a time; how many
this machine holds at once by default; what each process returned, took and peaked at."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from jaxcache.parallel import usable_cpus
from jaxcache.units import format_bytes

# What one target's process may take at its peak: the 6-layer decoder's warm-up peaked at 1,613 MiB for v5e:4x8 and
# 1,737 MiB for 2xv5e:4x8, the example's at 572 MiB (bench/README.md, "Several targets, one command").
TARGET_MEMORY = 2 * 2**30


@dataclass(frozen=True)
class Job:
    """One target's process: its spelling, platform and ``warmup`` arguments."""

    target: str
    platform: str
    argv: list[str]


@dataclass(frozen=True)
class Done:
    """What a target's process returned: exit code, its JSON summary (None when it printed none), its stderr,
    seconds of wall time and of CPU (with the processes it waited for), and its peak resident memory (of the process
    or, if larger, one it waited for)."""

    job: Job
    exit_code: int
    summary: dict[str, Any] | None
    stderr: str
    wall_s: float
    peak_rss_bytes: int
    cpu_s: float = 0.0


def default_parallel(targets: int) -> tuple[int, str]:
    """How many targets to compile at once here, and why, in words: one a usable CPU, as many as the memory
    available holds at :data:`TARGET_MEMORY` each, never more than there are targets."""
    cpus = _cpus()
    memory = available_memory()
    by_memory = max(1, memory // TARGET_MEMORY) if memory is not None else cpus
    chosen = max(1, min(targets, cpus, by_memory))
    held = (f"{format_bytes(memory)} of memory available holds {by_memory} at {format_bytes(TARGET_MEMORY)} a target"
            if memory is not None else "memory available unknown")
    return chosen, f"{cpus} usable CPU(s); {held}"


def _cpus() -> int:
    """Usable CPUs, within a container's CPU quota (cgroup v2 ``cpu.max``) where one is set."""
    cpus = usable_cpus()
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    return cpus


def available_memory() -> int | None:
    """Bytes this process's children may still take: the kernel's MemAvailable, or less within a container's limit
    (cgroup v2 ``memory.max`` less ``memory.current``); None where neither can be read."""
    found: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
        if limit != "max":
            found.append(max(0, int(limit) - current))
    return min(found) if found else None


def run_all(jobs: Sequence[Job], parallel: int, on_done: Callable[[Done], None]) -> list[Done]:
    """Run every job, ``parallel`` at a time; ``on_done`` sees each as it finishes (in this thread). Results come
    back in the jobs' order. Ctrl-C stops the processes still running."""
    live = _Live()
    results: dict[int, Done] = {}
    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="jaxcache-target") as pool:
        futures = {pool.submit(_run_one, job, live): i for i, job in enumerate(jobs)}
        try:
            for future in as_completed(futures):
                done = future.result()
                results[futures[future]] = done
                on_done(done)
        except BaseException:
            for future in futures:
                future.cancel()
            live.stop()
            raise
    return [results[i] for i in range(len(jobs))]


class _Live:
    """The targets' processes still running, so that an interrupted command stops them and starts no more."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stopped = False

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            for proc in self.procs.values():
                proc.terminate()


def _run_one(job: Job, live: _Live) -> Done:
    """One target's ``python -m jaxcache.warmup``; its output goes to files (no pipe to fill), read afterwards."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        with live.lock:
            if live.stopped:
                raise KeyboardInterrupt
            proc = subprocess.Popen([sys.executable, "-m", "jaxcache.warmup", *job.argv], stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL)
            live.procs[proc.pid] = proc
        # wait4, not Popen.wait: it gives this process's own resource use, its peak memory among it.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        with live.lock:
            live.procs.pop(proc.pid, None)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if code < 0:
        stderr += f"\nwarmup: error: the target's process was stopped by signal {-code}" + (
            " (out of memory? --parallel 1 runs one target at a time)" if -code == 9 else "")
    return Done(job, code, _last_json(stdout), stderr, round(wall, 3), usage.ru_maxrss * 1024,
                round(usage.ru_utime + usage.ru_stime, 2))


def _last_json(stdout: str) -> dict[str, Any] | None:
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
