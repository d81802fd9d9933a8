"""The last answer of `jaxcache ls --json`/`stats`, kept beside the head index: given again, byte for byte, while the
root lists the same, and never once anything under it changed or for other options."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxcache import entry as fmt
from jaxcache.cli import main

pytestmark = pytest.mark.usefixtures("index_dir")


def out_of(capsys, *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def kept_file(index_dir: Path, command: str) -> Path:
    (found,) = index_dir.glob(f"*.{command}")
    return found


def doctor_answer(path: Path, replace: bytes, by: bytes) -> None:
    """Change the kept answer's text (its length kept, as the header says it): only a command that gives the kept
    answer prints the change."""
    data = path.read_bytes()
    assert replace in data and len(replace) == len(by)
    path.write_bytes(data.replace(replace, by, 1))


def test_a_second_ls_gives_the_kept_answer_until_the_root_changes(capsys, cache_copy, jax_caches, index_dir):
    root = str(cache_copy)
    first = out_of(capsys, "ls", root, "--json")
    assert out_of(capsys, "ls", root, "--json") == first
    kept = kept_file(index_dir, "ls")
    doctor_answer(kept, b'"heads_read": true', b'"heads_read": null')
    assert json.loads(out_of(capsys, "ls", root, "--json"))["heads_read"] is None  # the answer was not rebuilt

    # An -atime file rewritten in place (a hit): its own size and mtime change, the directory's need not.
    victim = jax_caches["zstd"].entries[0]
    atime = cache_copy / (victim["key"] + "-atime")
    later_ns = (int(atime.stat().st_mtime) + 3600) * 10**9
    atime.write_bytes(fmt.encode_atime(later_ns))
    os.utime(atime, ns=(later_ns, later_ns))
    fresh = json.loads(out_of(capsys, "ls", root, "--json"))
    assert fresh["heads_read"] is True
    assert {e["key"]: e for e in fresh["entries"]}[victim["key"]]["last_used_s"] == later_ns / 1e9
    assert json.loads(out_of(capsys, "ls", root, "--json", "--no-index")) == fresh


def test_other_options_or_another_root_are_answered_afresh(capsys, cache_copy, jax_caches, index_dir, tmp_path):
    root = str(cache_copy)
    by_name = json.loads(out_of(capsys, "ls", root, "--json"))
    by_size = json.loads(out_of(capsys, "ls", root, "--json", "--sort", "size"))
    assert [e["size_bytes"] for e in by_size["entries"]] == sorted((e["size_bytes"] for e in by_name["entries"]),
                                                                   reverse=True)
    limited = json.loads(out_of(capsys, "ls", root, "--json", "--sort", "size", "--limit", "2"))
    assert limited["entries"] == by_size["entries"][:2]
    # The same entries under another path: its own answer, naming its own root.
    twin = tmp_path / "twin"
    shutil.copytree(cache_copy, twin, copy_function=shutil.copy2)
    other = json.loads(out_of(capsys, "ls", str(twin), "--json"))
    assert other["root"] != by_name["root"] and len(other["entries"]) == len(by_name["entries"])


def test_stats_table_and_json_come_from_one_kept_answer(capsys, cache_copy, index_dir):
    root = str(cache_copy)
    table = out_of(capsys, "stats", root)
    data = json.loads(out_of(capsys, "stats", root, "--json"))
    doctor_answer(kept_file(index_dir, "stats"), b'"orphans": 0', b'"orphans": 7')
    assert json.loads(out_of(capsys, "stats", root, "--json"))["orphans"] == 7
    assert "orphaned -atime files   7 " in out_of(capsys, "stats", root)
    (cache_copy / ("jit_gone-" + "0" * 64 + "-atime")).write_bytes(fmt.encode_atime(1))  # a new orphan
    again = json.loads(out_of(capsys, "stats", root, "--json"))
    assert again == {**data, "orphans": 1, "orphan_bytes": fmt.ATIME_BYTES}
    assert table.splitlines()[0] == f"root                    {data['root']}"


def test_an_unusable_kept_answer_is_rebuilt_silently(capsys, cache_copy, index_dir):
    root = str(cache_copy)
    first = out_of(capsys, "ls", root, "--json")
    kept = kept_file(index_dir, "ls")
    kept.write_bytes(b"garbage")
    assert out_of(capsys, "ls", root, "--json") == first
    assert capsys.readouterr().err == ""
    kept.write_bytes(kept.read_bytes()[:200])  # torn (a crash before the data reached the disk): the header holds
    assert kept.read_bytes().startswith(b"jaxcache answer")
    assert out_of(capsys, "ls", root, "--json") == first
    assert capsys.readouterr().err == ""


def test_no_index_keeps_no_answer(capsys, cache_copy, index_dir):
    out_of(capsys, "ls", str(cache_copy), "--json", "--no-index")
    out_of(capsys, "stats", str(cache_copy), "--no-index")
    assert not index_dir.exists() or not list(index_dir.iterdir())


@pytest.mark.parametrize("sink", ["file", "pipe"])
def test_the_kept_answer_reaches_a_file_or_a_pipe_whole(cache_copy, index_dir, tmp_path, sink):
    """A real process's stdout (the kernel copies a kept answer there), not a test's capture."""
    env = {**os.environ, "JAXCACHE_INDEX_DIR": str(index_dir)}
    cmd = [sys.executable, "-m", "jaxcache", "ls", str(cache_copy), "--json"]
    expected = subprocess.run([*cmd, "--no-index"], env=env, capture_output=True, check=True).stdout
    for _ in range(2):  # the first builds and keeps the answer, the second sends the kept one
        if sink == "file":
            out = tmp_path / "out.json"
            with open(out, "wb") as f:
                subprocess.run(cmd, env=env, stdout=f, check=True)
            got = out.read_bytes()
        else:
            got = subprocess.run(cmd, env=env, capture_output=True, check=True).stdout
        assert got == expected
