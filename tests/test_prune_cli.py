"""`jaxcache prune`: dry runs, applying, output, and bad input."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jaxcache import entry as fmt
from jaxcache.cli import main
from prune_support import (
    DAY,
    ORPHAN_KEY,
    age_cache,
    build_synthetic,
    run_cli,
    small_sources,
    snapshot,
)

# --------------------------------------------------------------------------------------------------------------
# The CLI


def _break_two(root: Path) -> list[str]:
    names = sorted(p.name for p in root.iterdir() if p.name.endswith("-cache"))[:2]
    (root / names[0]).write_bytes(b"")
    (root / names[1]).write_bytes(b"\x01" * 300)
    return names


def test_cli_dry_run_changes_nothing(capsys, cache_copy):
    now = time.time()
    age_cache(cache_copy, created_ago=20 * DAY, used_ago=15 * DAY, now=now)
    broken = _break_two(cache_copy)
    for name in broken:
        os.utime(cache_copy / name, (now - 20 * DAY, now - 20 * DAY))
    (cache_copy / f"{ORPHAN_KEY}-atime").write_bytes(fmt.encode_atime(1))
    os.utime(cache_copy / f"{ORPHAN_KEY}-atime", (now - DAY, now - DAY))
    before = snapshot(cache_copy)
    stat_before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in cache_copy.iterdir()}
    code, out, err = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "14d", "--corrupt", "--orphans")
    assert code == 0 and err == ""
    assert out.splitlines()[0].split() == ["FUNCTION", "HASH", "SIZE", "LAST", "USED", "REASONS"]
    assert "corrupt: empty file" in out and "unused for 15d" in out and "orphaned -atime file" in out
    assert "would delete" in out and "add --apply to delete" in out
    assert snapshot(cache_copy) == before
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in cache_copy.iterdir()} == stat_before


def test_cli_apply_deletes_exactly_the_plan(capsys, cache_copy):
    now = time.time()
    keys_ = age_cache(cache_copy, created_ago=20 * DAY, used_ago=2 * DAY, now=now)
    stale = keys_[-3:]
    for key in stale:
        (cache_copy / f"{key}-atime").write_bytes(fmt.encode_atime(int((now - 30 * DAY) * 1e9)))
    broken = _break_two(cache_copy)
    assert not {n[:-6] for n in broken} & set(stale)
    for name in broken:
        os.utime(cache_copy / name, (now - 20 * DAY, now - 20 * DAY))
    (cache_copy / "README.txt").write_text("not JAX's")
    pinned = stale[0]
    before = snapshot(cache_copy)

    code, out, _ = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "14d", "--corrupt", "--keep", pinned,
                           "--json")
    dry = json.loads(out)
    assert code == 0 and dry["applied"] is False and dry["result"] is None
    planned = {d["key"] for d in dry["delete"]}
    assert planned == (set(stale) - {pinned}) | {n[:-6] for n in broken}
    assert [d["key"] for d in dry["protected"]] == [pinned] and dry["protected_by_reason"] == {
        f"pinned by {pinned!r}": 1,
    }
    assert set(dry["delete"][0]) == {
        "key", "function", "hash", "name", "size_bytes", "created_s", "last_used_s", "status", "orphan", "reasons",
    }
    assert snapshot(cache_copy) == before

    code, out, _ = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "14d", "--corrupt", "--keep", pinned,
                           "--apply", "--json")
    done = json.loads(out)
    assert code == 0 and done["applied"] is True
    assert done["result"] == {
        "deleted": len(planned), "bytes_freed": dry["bytes_freed"], "already_gone": 0, "changed": 0, "errors": [],
    }
    gone = {f"{k}-cache" for k in planned} | {f"{k}-atime" for k in planned}
    assert snapshot(cache_copy) == {k: v for k, v in before.items() if k not in gone}

    code, out, _ = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "14d", "--corrupt", "--keep", pinned,
                           "--apply")
    assert code == 0 and "deleted 0 entries, freed 0 B" in out


def test_cli_text_output_caps_the_table_and_summarises_protected(capsys, tmp_path, cache_copy):
    now = time.time()
    root = tmp_path / "many"
    build_synthetic(root, small_sources(cache_copy), 80, now)
    code, out, _ = run_cli(capsys, "prune", str(root), "--unused-for", "3d", "--keep", "jit_tiny*")
    lines = out.splitlines()
    plan_json = json.loads(run_cli(capsys, "prune", str(root), "--unused-for", "3d", "--keep", "jit_tiny*",
                                   "--json")[1])
    n = len(plan_json["delete"])
    assert code == 0 and n > 50
    assert f"... and {n - 50} more" in lines
    assert lines.index(f"... and {n - 50} more") == 51  # header + 50 rows
    protected = len(plan_json["protected"])
    assert protected and f"protected: {protected} selected entries kept" in out
    assert f"{protected}  pinned by 'jit_tiny*'" in out
    assert f"would delete {n} entries, freeing " in out and " remain)" in out


def test_cli_apply_verbose_prints_a_line_per_entry(capsys, cache_copy):
    now = time.time()
    age_cache(cache_copy, created_ago=20 * DAY, used_ago=20 * DAY, now=now)
    expected = sorted(p.name for p in cache_copy.iterdir() if p.name.startswith(("jit_tiny-", "jit_odd")))
    assert len(expected) == 4
    code, out, err = run_cli(capsys, "prune", str(cache_copy), "--function", "jit_tiny", "--function", "jit_odd*",
                             "--apply", "-v")
    assert code == 0
    assert sorted(err.splitlines()) == [f"removed {n}" for n in expected if n.endswith("-cache")]
    assert "deleted 2 entries, freed" in out
    assert not [p for p in cache_copy.iterdir() if p.name.startswith(("jit_tiny-", "jit_odd"))]


def _heads_read(root: Path, act: Callable[[], list[str]]) -> tuple[list[str], list[str]]:
    """What ``act`` returns, and the entries of ``root`` whose bytes it read, by the file system's access times: each
    entry's is set before its mtime first, and any read moves it (under relatime too, the usual mount option)."""
    entries = [p for p in root.iterdir() if p.name.endswith("-cache")]
    for p in entries:
        mtime_ns = p.stat().st_mtime_ns
        os.utime(p, ns=(mtime_ns - 10**9, mtime_ns))
    answer = act()
    return answer, sorted(p.name for p in entries if p.stat().st_atime_ns >= p.stat().st_mtime_ns)


def test_cli_corrupt_reads_heads_through_the_head_index(capsys, cache_copy, index_dir, tmp_path):
    """A second `prune --corrupt` of an unchanged root reads no head; an entry broken since is read and found."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "read-cache").write_bytes(b"read once")
    if _heads_read(probe, lambda: [(probe / "read-cache").read_bytes().decode()])[1] != ["read-cache"]:
        pytest.skip("this file system does not record reads in access times (mounted noatime)")
    broken = _break_two(cache_copy)
    argv = ("prune", str(cache_copy), "--corrupt", "--min-age", "0s", "--json")

    def planned() -> list[str]:
        code, out, err = run_cli(capsys, *argv)
        assert code == 0 and err == ""
        return sorted(d["name"] for d in json.loads(out)["delete"])

    answer, read = _heads_read(cache_copy, planned)
    with_bytes = sorted(p.name for p in cache_copy.iterdir() if p.name.endswith("-cache") and p.stat().st_size)
    assert answer == broken and read == with_bytes  # every head (the empty entry has none to read)
    assert _heads_read(cache_copy, planned) == (broken, [])
    third = sorted(p.name for p in cache_copy.iterdir() if p.name.endswith("-cache") and p.name not in broken)[0]
    (cache_copy / third).write_bytes(b"\x02" * 100)
    assert _heads_read(cache_copy, planned) == (sorted([*broken, third]), [third])
    with_no_index = run_cli(capsys, *argv, "--no-index")[1]  # every head read by the plain scan
    assert sorted(d["name"] for d in json.loads(with_no_index)["delete"]) == sorted([*broken, third])


def test_cli_no_index_without_corrupt_exits_2(capsys, cache_copy):
    before = snapshot(cache_copy)
    code, out, err = run_cli(capsys, "prune", str(cache_copy), "--unused-for", "1d", "--no-index", "--apply")
    assert code == 2 and out == ""
    assert err == "jaxcache: error: --no-index needs --corrupt: without it prune reads no entry heads and no index\n"
    assert snapshot(cache_copy) == before


def test_cli_without_a_selecting_rule_exits_2(capsys, cache_copy):
    before = snapshot(cache_copy)
    for extra in ([], ["--keep", "x", "--min-age", "0s", "--apply"]):
        code, out, err = run_cli(capsys, "prune", str(cache_copy), *extra)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith("jaxcache: error: nothing selects entries: give --max-size")
    assert snapshot(cache_copy) == before


def test_the_no_rule_error_and_help_name_every_selecting_flag(capsys, tmp_path):
    """Every prune flag that is not a keep rule, an output or a modifier of another selects entries: the error for
    a prune without one, and --help, name each (--integrity was missing from both)."""
    from jaxcache.cli import build_parser

    (prune,) = [a for a in build_parser(only="prune")._actions if a.__class__.__name__ == "_SubParsersAction"]
    parser = prune.choices["prune"]
    others = {"--help", "--keep", "--min-age", "--no-index", "--apply", "--json", "--verbose", "--stale-jaxlib-window"}
    selecting = {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o not in others}
    assert {"--integrity", "--corrupt", "--max-size"} <= selecting
    code, _, error = run_cli(capsys, "prune", str(tmp_path))
    assert code == 2 and error.count("\n") == 1
    described = " ".join(parser.format_help().split())
    for flag in selecting:
        assert f"{flag} " in error or f"{flag}," in error, (flag, error)
        assert f"{flag}," in described or f"{flag})" in described, (flag, described)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-size", "50XB"], "--max-size: '50XB' is not a size"),
        (["--max-size=-5GiB"], "--max-size: '-5GiB' is negative: a size is 0 or more"),
        (["--unused-for", "two weeks"], "--unused-for: 'two weeks' is not a duration"),
        (["--older-than", "3x"], "--older-than: '3x' is not a duration"),
        (["--corrupt", "--min-age", "soon"], "--min-age: 'soon' is not a duration"),
        (["--function", ""], "empty pattern"),
    ],
)
def test_cli_bad_values_exit_2_with_one_line(capsys, cache_copy, argv, message):
    code, out, err = run_cli(capsys, "prune", str(cache_copy), *argv, "--apply")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("jaxcache: error:") and message in err and "Traceback" not in err


def test_cli_bad_root_exits_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "prune", str(tmp_path / "missing"), "--older-than", "1d")
    assert code == 2 and "does not exist" in err


def test_cli_help_points_to_doctor(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["prune", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "jaxcache doctor" in out and "--apply" in out and "--max-size" in out
