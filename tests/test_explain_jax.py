"""Every miss cause made to happen for real: JAX jobs in fresh processes write and read one cache, then
`jaxcache explain` names why the reader compiled. One test per cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxcache.cli import main as cli_main

JOB = Path(__file__).parent / "programs" / "explain_job.py"
pytestmark = pytest.mark.slow


def run(cache: Path, *args: str, python: str = sys.executable, env: dict[str, str] | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_", "XLA_FLAGS"))}
    proc = subprocess.run([python, str(JOB), "--cache-dir", str(cache), *args], capture_output=True, text=True,
                          timeout=300, env={**base, "JAX_PLATFORMS": "cpu", **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def causes(cache: Path, capsys, run_id: str) -> list[dict]:
    capsys.readouterr()
    assert cli_main(["explain", str(cache), "--run", run_id, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["misses"]


def only(misses: list[dict]) -> dict:
    assert len(misses) == 1, misses
    return misses[0]


def test_a_changed_input_shape_is_a_changed_program(tmp_path, capsys):
    run(tmp_path, "--rows", "32")
    miss = only(causes(tmp_path, capsys, run(tmp_path, "--rows", "16")["run_id"]))
    assert miss["cause"] == "program_changed" and miss["nearest"]
    assert any("argument 0: f32[32,16] → f32[16,16]" in c for c in miss["differs"][0]["changes"]), miss


def test_a_second_shape_in_one_first_run_is_a_changed_program(tmp_path, capsys):
    """A cache only this run wrote: the entry of the first shape is the run's own, not plain JAX's."""
    misses = causes(tmp_path, capsys, run(tmp_path, "--rows", "32", "--then-rows", "16")["run_id"])
    first, second = sorted(misses, key=lambda m: m["cause"] != "new_program")
    assert first["cause"] == "new_program" and second["cause"] == "program_changed", misses
    assert any("argument 0: f32[32,16] → f32[16,16]" in c for c in second["differs"][0]["changes"]), second
    assert "plain JAX" not in second["fix"] and "bucket or pad" in second["fix"], second


def test_changed_xla_flags_say_which_flag(tmp_path, capsys):
    run(tmp_path, env={"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    reader = run(tmp_path, env={"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"})
    miss = only(causes(tmp_path, capsys, reader["run_id"]))
    flags = next(d for d in miss["differs"] if d["part"] == "xla_flags")
    assert miss["cause"] == "xla_flags" and flags["changes"] == ["--xla_cpu_enable_fast_math: true → false"]


def test_two_against_four_devices(tmp_path, capsys):
    run(tmp_path, "--devices", "2")
    miss = only(causes(tmp_path, capsys, run(tmp_path, "--devices", "4")["run_id"]))
    devices = next(d for d in miss["differs"] if d["part"] == "devices")
    assert miss["cause"] == "devices" and "2 ×" in devices["theirs"] and "4 ×" in devices["mine"], miss


def test_a_zlib_writer_without_jaxcache_and_a_zstd_reader(tmp_path, capsys):
    run(tmp_path, "--plain", "--hide-zstandard")
    miss = only(causes(tmp_path, capsys, run(tmp_path)["run_id"]))
    assert miss["cause"] == "compression" and miss["differs"][0]["theirs"] == "zlib", miss


def test_a_newer_jax_writer_and_an_older_reader(tmp_path, capsys, next_python_with_jaxcache):
    python, env = next_python_with_jaxcache
    run(tmp_path, python=python, env=env)
    miss = only(causes(tmp_path, capsys, run(tmp_path)["run_id"]))
    jaxlib = next(d for d in miss["differs"] if d["part"] == "jaxlib")
    assert miss["cause"] == "jaxlib" and jaxlib["theirs"] != jaxlib["mine"] and jaxlib["theirs"] in miss["fix"]


def test_a_program_under_the_compile_time_threshold_was_not_written(tmp_path, capsys):
    run(tmp_path, "--default-thresholds")
    miss = only(causes(tmp_path, capsys, run(tmp_path)["run_id"]))
    assert miss["cause"] == "not_written" and "min_compile_time_secs" in miss["fix"], miss


def test_a_lowering_that_differs_every_run_is_unstable(tmp_path, capsys):
    first = run(tmp_path, "--unstable")
    assert only(causes(tmp_path, capsys, first["run_id"]))["cause"] == "new_program"
    time.sleep(1.1)
    miss = only(causes(tmp_path, capsys, run(tmp_path, "--unstable")["run_id"]))
    assert miss["cause"] == "unstable_program" and "shard_map" in miss["fix"], miss


def test_other_compiler_options_are_named_with_both_values(tmp_path, capsys):
    run(tmp_path, "--compiler-option", "xla_cpu_enable_fast_math=false")
    miss = only(causes(tmp_path, capsys, run(tmp_path, "--compiler-option",
                                              "xla_cpu_enable_fast_math=true")["run_id"]))
    options = next(d for d in miss["differs"] if d["part"] == "compile_options")
    assert miss["cause"] == "compile_options", miss
    assert options["changes"] == ["compiler_options.xla_cpu_enable_fast_math: False → True"], miss
    assert "compiler_options.xla_cpu_enable_fast_math: False → True" in miss["fix"], miss


def test_an_uncommitted_argument_names_the_sharding_option_it_changes(tmp_path, capsys):
    """The miss measured on a TPU: the writer placed every argument on its mesh, the reader left one uncommitted."""
    run(tmp_path, "--devices", "2", "--place", "all")
    miss = only(causes(tmp_path, capsys, run(tmp_path, "--devices", "2", "--place", "second")["run_id"]))
    options = next(d for d in miss["differs"] if d["part"] == "compile_options")
    change = "allow_spmd_sharding_propagation_to_parameters: [False ×2] → [True, False]"
    assert miss["cause"] == "compile_options" and change in options["changes"], miss
    assert change in miss["fix"] and "NamedSharding" in miss["fix"], miss


def test_an_entry_pruned_between_two_runs_was_evicted(tmp_path, capsys):
    run(tmp_path)
    for entry in tmp_path.glob("jit_step-*"):
        entry.unlink()
    miss = only(causes(tmp_path, capsys, run(tmp_path)["run_id"]))
    assert miss["cause"] == "evicted", miss


def test_a_truncated_entry_is_unreadable(tmp_path, capsys):
    run(tmp_path)
    (entry,) = tmp_path.glob("jit_step-*-cache")
    stat = entry.stat()
    entry.write_bytes(entry.read_bytes()[: stat.st_size // 2])
    os.utime(entry, (stat.st_atime, stat.st_mtime))
    time.sleep(2.5)  # older than the reader's lookup by more than the client's slack
    reader = run(tmp_path)
    miss = only(causes(tmp_path, capsys, reader["run_id"]))
    assert miss["cause"] == "unreadable" and f"rm -f {entry} " in miss["fix"], miss
    # The job's own summary gives the same fix for it: the advice after what is wrong with the entry.
    fix = miss["fix"].rsplit("; ", 1)[1]
    assert fix.startswith("JAX recompiles it") and fix in reader["summary"], (fix, reader["summary"])
    # JAX says it writes, and writes nothing over an entry that exists: the record must not claim (or attest) it.
    assert [k["event"] for k in reader["keys"]] == ["compiled"], reader
    assert entry.stat().st_size == stat.st_size // 2


@pytest.mark.parametrize(("age_s", "was_there"), [(1.0, False), (3.0, True)])
def test_the_summary_and_explain_agree_whether_an_entry_was_there_before_the_lookup(tmp_path, capsys, age_s,
                                                                                    was_there):
    """JAX does not write the reader's program (under its 1 s compile-time threshold), so its put never finds the
    entry there: the client's summary and `jaxcache explain` both tell from the entry's age alone whether the miss
    met an unreadable entry, by one rule. 1 s before the lookup is within the clocks' slack (an object store's
    whole-second mtime), 3 s is not."""
    run(tmp_path)
    (entry,) = tmp_path.glob("jit_step-*-cache")
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    reader = run(tmp_path, "--default-thresholds", "--age-entries", str(age_s))
    assert [k["event"] for k in reader["keys"]] == ["compiled"], reader
    miss = only(causes(tmp_path, capsys, reader["run_id"]))
    assert ("1 unreadable" in reader["summary"]) is was_there, reader["summary"]
    assert (miss["cause"] == "unreadable") is was_there, miss


@pytest.mark.parametrize("store", ["directory", "gs", "s3", "az"])
def test_a_first_run_gets_the_same_account_on_every_store(tmp_path, capsys, request, store):
    """A job's first run on a fresh root compiles one function at three shapes: the first is new to the cache, the
    others changed programs, whatever the store. S3 and Azure keep whole-second mtimes: the entries the run writes in
    the second of its first lookup read as older than it, and must not pass for another writer's (plain JAX's)."""
    from store_servers import BUCKETS

    root = str(tmp_path) if store == "directory" else f"{store}://{request.getfixturevalue(BUCKETS[store])}/cache3"
    run(root, "--rows", "32", "--then-rows", "16", "--then-rows", "8", "--on-the-second")
    capsys.readouterr()
    assert cli_main(["explain", root, "--job", "train", "--json"]) == 0
    misses = json.loads(capsys.readouterr().out)["misses"]
    assert sorted(m["cause"] for m in misses) == ["new_program", "program_changed", "program_changed"], misses
    assert not any("plain JAX" in m["fix"] for m in misses), misses
