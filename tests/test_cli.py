"""The `jaxcache` command on real caches: tables, stable JSON, exit codes, corrupt entries."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxcache.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_table_and_json(capsys, cache_copy, jax_caches):
    manifest = jax_caches["zstd"].manifest
    code, out, _ = run(capsys, "ls", str(cache_copy))
    assert code == 0
    header = out.splitlines()[0]
    assert header.split() == ["FUNCTION", "HASH", "SIZE", "STORED", "COMPILE", "AGE", "LAST", "USED", "COMPRESSION",
                              "STATUS"]
    assert "jit_odd-name.v2" in out and "KiB" in out
    assert out.rstrip().endswith(str(cache_copy))

    code, out, _ = run(capsys, "ls", str(cache_copy), "--json")
    data = json.loads(out)
    assert code == 0 and data["root"] == str(cache_copy)
    assert {e["key"] for e in data["entries"]} == {e["key"] for e in manifest["entries"]}
    first = data["entries"][0]
    assert set(first) == {
        "key", "function", "hash", "size_bytes", "compression", "compile_seconds", "status", "reason",
        "created_s", "last_used_s", "has_atime",
    }
    assert [e["key"] for e in data["entries"]] == sorted(e["key"] for e in data["entries"])  # default: name


def test_ls_sort_filter_limit(capsys, cache_copy, jax_caches):
    entries = jax_caches["zstd"].entries
    _, out, _ = run(capsys, "ls", str(cache_copy), "--json", "--sort", "size", "--limit", "3")
    got = json.loads(out)["entries"]
    assert [e["size_bytes"] for e in got] == sorted((e["size_bytes"] for e in entries), reverse=True)[:3]

    _, out, _ = run(capsys, "ls", str(cache_copy), "--json", "--sort", "compile", "--limit", "1")
    assert json.loads(out)["entries"][0]["compile_seconds"] == max(e["stored_compile_seconds"] for e in entries)

    _, out, _ = run(capsys, "ls", str(cache_copy), "--json", "--function", "jit_odd*")
    assert [e["function"] for e in json.loads(out)["entries"]] == ["jit_odd-name.v2"]

    _, out, _ = run(capsys, "ls", str(cache_copy), "--json", "--sort", "age")
    created = [e["created_s"] for e in json.loads(out)["entries"]]
    assert created == sorted(created)


def test_stats(capsys, cache_copy, jax_caches):
    entries = jax_caches["zstd"].entries
    code, out, _ = run(capsys, "stats", str(cache_copy), "--json")
    s = json.loads(out)
    assert code == 0
    assert s["entries"] == len(entries)
    assert s["size_bytes"] == sum(e["size_bytes"] for e in entries)
    assert s["compile_seconds"] == sum(e["stored_compile_seconds"] for e in entries)
    assert s["compression"] == {"zstd": len(entries)}
    assert s["corrupt"] == 0 and s["orphans"] == 0 and s["with_atime"] == len(entries)
    per_fn = {f["function"]: f for f in s["by_function"]}
    assert per_fn["jit_train_step"]["entries"] == 1
    code, out, _ = run(capsys, "stats", str(cache_copy))
    assert code == 0 and "by function" in out and "zstd" in out


def test_doctor_clean_cache(capsys, cache_copy):
    code, out, _ = run(capsys, "doctor", str(cache_copy))
    assert code == 0 and "no problems found" in out


def _break(root: Path, jax_caches) -> dict[str, str]:
    entries = jax_caches["zstd"].entries
    damaged = {
        entries[0]["file"]: "",
        entries[1]["file"]: "half",
        entries[2]["file"]: "garbage",
    }
    for name, how in damaged.items():
        data = (root / name).read_bytes()
        (root / name).write_bytes({"": b"", "half": data[: len(data) // 2], "garbage": b"\x01" * 300}[how])
    (root / ("jit_gone-" + "0" * 64 + "-atime")).write_bytes(b"\x00" * 8)
    return damaged


def test_doctor_finds_corrupt_and_orphans(capsys, cache_copy, jax_caches):
    damaged = _break(cache_copy, jax_caches)
    code, out, _ = run(capsys, "doctor", str(cache_copy), "--json")
    d = json.loads(out)
    assert code == 1 and d["problems"] is True
    assert {c["name"] for c in d["corrupt"]} == set(damaged)
    assert all(c["reason"] for c in d["corrupt"])
    assert [o["key"] for o in d["orphans"]] == ["jit_gone-" + "0" * 64]
    assert d["ok"] == len(jax_caches["zstd"].entries) - 3
    code, out, _ = run(capsys, "doctor", str(cache_copy))
    assert code == 1 and "corrupt entries (3)" in out and "jaxcache prune" in out


def test_corrupt_entries_never_crash_ls_or_stats(capsys, cache_copy, jax_caches):
    _break(cache_copy, jax_caches)
    code, out, _ = run(capsys, "ls", str(cache_copy), "--sort", "compile")
    assert code == 0 and "corrupt" in out
    code, out, _ = run(capsys, "stats", str(cache_copy), "--json")
    assert code == 0 and json.loads(out)["corrupt"] == 3


def test_doctor_explains_mixed_compression(capsys, tmp_path, jax_caches):
    root = tmp_path / "mixed"
    shutil.copytree(jax_caches["zstd"].root, root)
    for e in jax_caches["zlib"].entries[:2]:
        shutil.copy(Path(jax_caches["zlib"].root, e["file"]), root / e["file"])
    code, out, _ = run(capsys, "doctor", str(root))
    assert code == 1
    assert "entries written by processes with and without zstandard can never hit each other" in out
    code, out, _ = run(capsys, "stats", str(root), "--json")
    assert json.loads(out)["mixed_compression"] is True


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ls", "/definitely/not/here"], "does not exist"),
        (["stats", "hdfs://bucket/x"], "unsupported scheme"),
        (["doctor", "gs://UPPER/x"], "not a valid bucket name"),
    ],
)
def test_bad_roots_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("jaxcache: error:") and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [([], "jaxcache: error: the following arguments are required: COMMAND"),
     (["ls"], "jaxcache ls: error: the following arguments are required: ROOT"),
     (["ls", "x", "--sort", "colour"], "jaxcache ls: error: argument --sort: invalid choice: 'colour'"),
     (["ls", "x", "--limit", "abc"], "jaxcache ls: error: argument --limit: 'abc': use a whole number, 0 or more"),
     (["ls", "x", "--limit", "-3"], "jaxcache ls: error: argument --limit: '-3': use a whole number, 0 or more"),
     (["prune", "x", "--unused-for"], "jaxcache prune: error: argument --unused-for: expected one argument"),
     (["bundle", "export", "x", "--job"], "jaxcache bundle export: error: argument --job: expected one argument"),
     (["frobnicate", "x"], "jaxcache: error: argument COMMAND: invalid choice: 'frobnicate'"),
     # A mistyped option is named with the one meant, not the root its value pushed out (#73).
     (["ls", "--srot", "size", "x"], "jaxcache ls: error: unrecognized arguments: --srot: did you mean --sort?"),
     (["ls", "x", "--heds"], "jaxcache ls: error: unrecognized arguments: --heds: did you mean --heads?"),
     (["ls", "x", "y"], "jaxcache ls: error: unrecognized arguments: y")],
)
def test_usage_errors_are_one_line_on_stderr(capsys, argv, said):
    """The user guide's promise (#60): one line that names the option and what it takes, not the usage block."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert err.startswith(said) and err.count("\n") == 1 and "usage:" not in err, err


@pytest.mark.parametrize(("argv", "said"), [
    (["--unused-for", "-3d"], "--unused-for: '-3d' is negative: a duration is 0 or more, like 14d"),
    (["--unused-for=-3d"], "--unused-for: '-3d' is negative"),
    (["--older-than", "-1h"], "--older-than: '-1h' is negative"),
    (["--max-size", "-5GiB"], "--max-size: '-5GiB' is negative: a size is 0 or more"),
])
def test_a_negative_value_is_read_as_the_options_and_refused(capsys, tmp_path, argv, said):
    """``--unused-for -3d`` is not "expected one argument": the value is there, and it is negative (#60)."""
    code, out, err = run(capsys, "prune", str(tmp_path), *argv)
    assert code == 2 and out == "" and err == f"jaxcache: error: {said}" + err.split(said, 1)[1]
    assert err.count("\n") == 1, err


def test_an_object_store_root(capsys, store_root, jax_caches):
    from store_servers import put_dir

    put_dir(store_root, jax_caches["zlib"].root)
    code, out, _ = run(capsys, "stats", store_root + "/", "--json")
    assert code == 0 and json.loads(out)["entries"] == len(jax_caches["zlib"].entries)
    code, out, _ = run(capsys, "doctor", store_root)
    assert code == 0, out

    # A prefix mistyped lists as an empty root (a store has no folders to be missing): it says so, and what is beside.
    scheme, _, rest = store_root.partition("://")
    bucket = rest.split("/")[0]
    code, out, err = run(capsys, "ls", f"{scheme}://{bucket}/jax-cahce")
    assert code == 0 and "0 entries" in out, out
    assert err == (f"jaxcache ls: nothing is under {scheme}://{bucket}/jax-cahce/ (no object at all): did you mean"
                   f" {store_root}? Beside it: {store_root}\n"), err
    code, _, err = run(capsys, "stats", f"{scheme}://{bucket}/elsewhere/jax-cache")
    assert code == 0 and err.endswith(f"is the prefix spelled as the jobs spell it? No prefix is beside it in"
                                      f" {scheme}://{bucket}/elsewhere\n"), err
    code, out, err = run(capsys, "ls", store_root, "--function", "jit_nothing*")
    assert code == 0 and err == "", "a filter that chose nothing is no empty prefix"


def test_console_script_and_help(cache_copy):
    exe = Path(sys.executable).with_name("jaxcache")
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "Exit codes" in proc.stdout
    for sub in ("ls", "stats", "doctor"):
        proc = subprocess.run([str(exe), sub, "--help"], capture_output=True, text=True)
        assert proc.returncode == 0 and "ROOT" in proc.stdout
    proc = subprocess.run([str(exe), "ls", str(cache_copy), "--limit", "1"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""  # no progress bar when stderr is not a terminal


def test_ls_into_a_closed_pipe(tmp_path):
    # Enough rows that `head` closes the pipe while jaxcache is still writing.
    for i in range(4000):
        (tmp_path / f"jit_f{i}-{i:064x}-cache").write_bytes(b"x")
    exe = Path(sys.executable).with_name("jaxcache")
    proc = subprocess.run(
        ["bash", "-c", f"'{exe}' ls '{tmp_path}' | head -1; echo \"rc=${{PIPESTATUS[0]}}\""],
        capture_output=True, text=True, timeout=120,
    )
    assert "rc=0" in proc.stdout and "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr


@pytest.mark.parametrize(("n", "noun", "said"), [(0, "entry", "0 entries"), (1, "entry", "1 entry"),
                                                 (2, "miss", "2 misses"), (1, "miss", "1 miss"), (3, "key", "3 keys"),
                                                 (2, "day", "2 days"), (2, "child", "2 children")])
def test_plural(n, noun, said):
    from jaxcache.units import plural

    assert plural(n, noun, "children" if noun == "child" else None) == said


def test_one_entry_is_said_as_one(capsys, tmp_path):
    from conftest import fake_entries

    root = tmp_path / "cache"
    root.mkdir()
    fake_entries(root, 1, age_days=3)
    (root / ("jit_gone-" + "0" * 64 + "-atime")).write_bytes(b"\0" * 8)  # one orphaned -atime file
    said = {
        ("ls", str(root), "--no-index"): "\n1 entry, ",
        ("doctor", str(root)): "checked 1 entry in ",
        ("prune", str(root), "--older-than", "1d"): "would delete 1 entry, ",
    }
    for argv, text in said.items():
        out = run(capsys, *argv)[1]
        assert text in out and " 1 entries" not in out, (argv, out)
    assert "1 orphaned -atime file;" in run(capsys, "doctor", str(root))[1]


def test_ls_says_what_last_used_reads(capsys, tmp_path):
    """LAST USED is the -atime file's, which JAX writes only with its LRU on: a job's reported hit (what the
    service shows) is not there, so the table says what the column reads instead of silently disagreeing."""
    from conftest import fake_entries
    from jaxcache.cli.ls_table import USED_NOTE

    root = tmp_path / "cache"
    root.mkdir()
    hit, *_ = sorted(fake_entries(root, 2, age_days=3))
    (root / f"{hit}-atime").unlink()  # JAX's LRU off, as in the demo: no -atime, whatever jobs hit
    out = run(capsys, "ls", str(root), "--no-index")[1]
    (row,) = [line for line in out.splitlines() if line.startswith("jit_fake00000")]
    assert row.split()[-3] == "-", row  # ... LAST USED, COMPRESSION, STATUS
    assert f"\n{USED_NOTE}\n2 entries, " in out
    assert "-atime" in USED_NOTE and "jobs report" in USED_NOTE
