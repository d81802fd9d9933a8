"""jaxcache.parallel's forked helpers: results in order and equal to one process's, a failing child's share done by
the parent, no fork while other threads run. Forks are made in fresh processes: pytest's own runs threads."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

from jaxcache.parallel import forked_chunks, forked_half
from jaxcache.storage.files import GONE, NOT_REGULAR
from jaxcache.storage.files import stat_names as _stat_names
from jaxcache.storage.local import LocalStorage

_FORKED_STATS = """
import json, os, sys
import jaxcache.storage.local as local
forks, fork = [], os.fork
def counted():
    pid = fork()
    if pid:
        forks.append(pid)
    return pid
os.fork = counted
local.FORK_MIN_STATS = 2
listing = local.LocalStorage(sys.argv[1]).list_stats(tuple(sys.argv[2:]))
print(json.dumps({"forks": len(forks), "listing": listing}))
"""

_FAILING_CHILD = """
import json, os
from jaxcache.parallel import forked_half
parent = os.getpid()
def task(items):
    if os.getpid() != parent:
        raise RuntimeError("the child fails")
    return [[os.getpid(), x * 2] for x in items]
print(json.dumps(forked_half(task, list(range(11)), min_items=2)))
"""


def _run(code: str, *args: str) -> object:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(done.stdout)


def test_a_big_listing_stats_half_its_files_in_a_forked_child_as_one_process_would(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    for i in range(41):
        (root / f"jit_f-{i:064x}-cache").write_bytes(b"x" * i)
        if i % 3 == 0:
            (root / f"jit_f-{i:064x}-atime").write_bytes(b"t" * 8)
    (root / "xla_gpu_sub").mkdir()  # not a file: never listed
    for suffixes in ((), ("-cache",)):
        serial = LocalStorage(str(root)).list_stats(suffixes)
        assert len(serial) == (55 if not suffixes else 41)
        got = _run(_FORKED_STATS, str(root), *suffixes)
        assert got["forks"] == 1 and got["listing"] == [list(row) for row in serial]


def test_a_child_that_fails_leaves_its_half_to_the_parent():
    got = _run(_FAILING_CHILD)
    assert [x for _, x in got] == [2 * i for i in range(11)]
    assert len({pid for pid, _ in got}) == 1  # every result is the parent's


def test_a_file_deleted_after_the_names_were_read_is_left_out(tmp_path):
    (tmp_path / "here-cache").write_bytes(b"abc")
    os.mkfifo(tmp_path / "fifo-cache")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        here_size, here_mtime, gone_size, _, fifo_size, fifo_mode = _stat_names(
            fd, ["here-cache", "gone-cache", "fifo-cache"])
    finally:
        os.close(fd)
    assert (here_size, here_mtime) == (3, (tmp_path / "here-cache").stat().st_mtime)
    assert gone_size == GONE and fifo_size == NOT_REGULAR and stat.S_ISFIFO(int(fifo_mode))
    root = LocalStorage(str(tmp_path))
    assert [o[:2] for o in root.list_stats(("-cache",))] == [("here-cache", 3)]
    assert root.skipped.items() == [("fifo-cache", "a FIFO, not a regular file")]


def test_forked_helpers_stay_in_this_process_while_other_threads_run():
    ready, stop = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (ready.set(), stop.wait()))
    other.start()
    try:
        ready.wait()
        got = list(forked_chunks(lambda chunk: (os.getpid(), sum(chunk)), list(range(10)), chunk=3, workers=2))
        half = forked_half(lambda items: [(os.getpid(), x) for x in items], list(range(10)), min_items=2)
    finally:
        stop.set()
        other.join()
    assert got == [(os.getpid(), 3), (os.getpid(), 12), (os.getpid(), 21), (os.getpid(), 9)]
    assert half == [(os.getpid(), x) for x in range(10)]  # tuples: nothing went through a pipe
