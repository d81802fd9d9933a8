"""`warmup` with several targets (--topology repeated, --targets FILE, --index): each target checked before any starts,
then compiled in a process of its own, N at a time, summed up in one table with the worst target's exit code."""

from __future__ import annotations

import json

import pytest

from jaxcache import coverage
from jaxcache.errors import InvalidInputError
from jaxcache.topology import parse_tpu_slice
from jaxcache.warmup import targets, tpu
from jaxcache.warmup.cli import build_parser
from test_warmup import EXAMPLE, warmup
from test_warmup_check import snapshot

CPU = ("--platform", "cpu", "--entrypoint", EXAMPLE)


def warmup_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("warmup:")]


def test_a_targets_file_lists_one_a_line(tmp_path):
    listed = tmp_path / "targets.txt"
    listed.write_text("# the release's shapes\nv5e:2x4\n\n  v5e:16x16   # production\n2xv5e:16x16\n")
    assert targets.from_args(None, str(listed), None) == ["v5e:2x4", "v5e:16x16", "2xv5e:16x16"]
    assert targets.from_args(["1x1x2"], str(listed), 3) == ["2xv5e:16x16"], "--topology first, then the file"
    for text, why in (("v5e:2x4 v5e:4x8\n", "line 1: 'v5e:2x4 v5e:4x8': one target a line"),
                      ("# nothing\n\n", "lists no target"),
                      ("v5e:4x8\nV5E:4x8@2x2x1\n", "target v5e:4x8 is listed twice"),
                      ("v5e:4x8\nv5e:3x3\n", "v5e makes no 3x3 slice")):
        listed.write_text(text)
        with pytest.raises(InvalidInputError, match=why):
            targets.from_args(None, str(listed), None)
    listed.write_text("v5e:2x4\nv5e:4x8\n")
    with pytest.raises(InvalidInputError, match="--index 2: the list has 2 target"):
        targets.from_args(None, str(listed), 2)
    with pytest.raises(InvalidInputError, match="missing.txt: no such file"):
        targets.from_args(None, str(tmp_path / "missing.txt"), None)


@pytest.mark.parametrize(("args", "message"), [
    (["--topology", "1x1x2", "--topology", "1x1x4", "--num-slices", "2"], "write each one whole"),
    (["--topology", "v5e:2x4", "--topology", "v5e:4x8", "--chips-per-host", "2x4"], "write each one whole"),
    (["--topology", "1x1x2", "--num-slices", "2"], "--num-slices is for TPU slices"),
    (["--topology", "1x1x2", "--topology", "1X1X2"], "target 1x1x2 is listed twice"),
    (["--targets", "listed.txt", "--index", "1"], "--index 1: the list has 1 target"),
    (["--topology", "1x1x2", "--parallel", "0"], "'0': use a whole number, 1 or more"),
])
def test_bad_lists_exit_2_one_line_nothing_written(tmp_path, args, message):
    (tmp_path / "listed.txt").write_text("1x1x2\n")
    args = [str(tmp_path / a) if a == "listed.txt" else a for a in args]
    cache = tmp_path / "c"
    proc = warmup(*args, "--cache-dir", str(cache), *CPU, expect=2)
    (line,) = warmup_lines(proc)
    assert message in line, proc.stderr
    assert not cache.exists()


def test_gpu_targets_are_refused_before_any_target_starts(tmp_path):
    """This machine has no GPU: the list's GPU targets are refused in one line, and no other target starts."""
    cache = tmp_path / "c"
    proc = warmup("--platform", "gpu", "--topology", "1x1x2", "--topology", "1x1x1", "--cache-dir", str(cache),
                  "--entrypoint", EXAMPLE, expect=2)
    (line,) = warmup_lines(proc)
    assert line.startswith("warmup: error: --platform gpu needs 2 GPU(s)"), proc.stderr
    assert "at a time" not in proc.stdout + proc.stderr and not cache.exists()


def test_many_targets_each_in_a_process_of_its_own_then_checked(tmp_path):
    cache = tmp_path / "c"
    proc = warmup("--topology", "1x1x2", "--topology", "1x1x4", "--cache-dir", str(cache), *CPU, "--json")
    out = json.loads(proc.stdout)
    assert [(t["target"], t["exit"], t["summary"]["written"]) for t in out["targets"]] == [("1x1x2", 0, 1),
                                                                                            ("1x1x4", 0, 1)]
    assert out["exit"] == 0 and "usable CPU" in out["parallel_why"] and "at a time (the default here" in proc.stderr
    assert "[1/2]" in proc.stderr and "[2/2]" in proc.stderr, "a line as each target finishes"
    records = [coverage.parse((cache / t["summary"]["coverage_record"]).read_bytes()) for t in out["targets"]]
    assert [(r.topology, r.fingerprint.local_device_count) for r in records] == [("1x1x2", 2), ("1x1x4", 4)]
    assert all(t["peak_rss_bytes"] > 50 * 2**20 and t["wall_s"] > 0 and t["cpu_s"] > 0 for t in out["targets"])

    before = snapshot(cache)
    check = warmup("--check", "--topology", "1x1x2", "--topology", "1x1x4", "--topology", "1x1x1", "--cache-dir",
                   str(cache), *CPU, "--parallel", "2", expect=1)
    lines = check.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("target ")):]
    assert table[0].split()[:6] == ["target", "platform", "checked", "on", "programs", "hits"], check.stdout
    rows = {line.split()[0]: line.split() for line in table[1:4]}
    assert rows["1x1x2"][4:7] == ["1", "1", "100%"] and rows["1x1x4"][4:7] == ["1", "1", "100%"]
    assert rows["1x1x1"][4:7] == ["1", "0", "0%"] and rows["1x1x1"][-2:] == ["1", "failed"]
    assert "---- 1x1x1 ----\ncheck: 0 of 1 program hit" in check.stdout
    assert "2 at a time (--parallel 2)" in check.stdout
    assert snapshot(cache) == before, "a check writes nothing"

    plans = json.loads(warmup("--dry-run", "--topology", "1x1x2", "--topology", "1x1x4", "--cache-dir",
                              str(tmp_path / "d"), *CPU, "--json").stdout)
    assert [(t["target"], t["summary"]["jax_settings"]["jax_num_cpu_devices"]) for t in plans["targets"]] == [
        ("1x1x2", 2), ("1x1x4", 4)], "each target of a repeated --topology, not only the last"


def test_a_failing_target_does_not_stop_the_others(tmp_path):
    cache = tmp_path / "c"
    proc = warmup("--topology", "1x1x2", "--topology", "1x1x4", "--cache-dir", str(cache), "--platform", "cpu",
                  "--entrypoint", "warm_targets:fails_on_two_devices", "--parallel", "1", expect=1)
    lines = proc.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("target ")):]
    rows = {line.split()[0]: line.split() for line in table[1:3]}
    assert rows["1x1x2"][-2:] == ["1", "failed"] and rows["1x1x2"][2] == "-"
    assert rows["1x1x4"][-2:] == ["0", "ok"] and rows["1x1x4"][2:4] == ["1", "1"]
    details = proc.stdout.split("---- 1x1x2 ----", 1)[1]
    assert "this target's own bug" in details and "traceback from YOUR code" in details
    assert "---- 1x1x4 ----" not in proc.stdout
    (record,) = cache.glob(".jaxcache/warmups/*.json")
    assert coverage.parse(record.read_bytes()).topology == "1x1x4"

    # Again: the target that wrote its program finds it there, a success the table names; the other fails again.
    again = warmup("--topology", "1x1x2", "--topology", "1x1x4", "--cache-dir", str(cache), "--platform", "cpu",
                   "--entrypoint", "warm_targets:fails_on_two_devices", "--parallel", "1", expect=1)
    lines = again.stdout.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[next(i for i, line in enumerate(lines)
                                                                  if line.startswith("target ")) + 1:][:2]}
    assert rows["1x1x4"][-3:] == ["0", "already", "warm"] and rows["1x1x4"][2:5] == ["1", "0", "1"], again.stdout
    assert rows["1x1x2"][-2:] == ["1", "failed"] and "---- 1x1x4 ----" not in again.stdout


def test_a_targets_process_gets_the_commands_options_for_it_alone():
    parser = build_parser()
    args = parser.parse_args(["--topology", "v5e:2x2", "--topology", "1x1x4", "--cache-dir", "/c", "--entrypoint",
                              "m:f", "--job", "j", "--verify", "--verify-timeout", "90", "--ok-if-warm", "--trust",
                              "warn", "--libtpu-init-args=--xla_tpu_x=1 --xla_tpu_y=2", "--parallel", "2",
                              "--platform", "cpu"])
    for text, platform in (("v5e:2x2", "tpu"), ("1x1x4", "cpu")):
        one = targets.for_target(args, text)
        argv = targets.child_argv(parser, one, platform=platform, script_args=[], check_on="compile-only")
        again = parser.parse_args(argv)
        assert again.topology == [text] and again.platform == platform and again.json
        assert (again.cache_dir, again.entrypoint, again.job, again.verify, again.verify_timeout, again.ok_if_warm,
                again.trust, again.check_on) == ("/c", "m:f", "j", True, 90.0, True, "warn", "compile-only")
        assert again.parallel is None and again.targets is None and again.index is None
        assert again.libtpu_init_args == ("--xla_tpu_x=1 --xla_tpu_y=2" if platform == "tpu" else None)

    # A TPU target's process is handed the flags the command resolved and checked, in place of the options they came
    # from (it neither reads the job's records again nor checks them again).
    flags = tpu.TargetFlags((), ("--xla_tpu_x=1",), source="run r1 of job 'pretrain'")
    one = targets.for_target(parser.parse_args(["--topology", "v5e:2x2", "--topology", "v5e:1x1", "--cache-dir", "/c",
                                                "--entrypoint", "m:f", "--flags-from-job", "pretrain"]), "v5e:2x2")
    again = parser.parse_args(targets.child_argv(parser, one, platform="tpu", script_args=[],
                                                 checked_flags=flags.to_json()))
    assert (again.flags_from_job, again.libtpu_init_args, again.target_xla_flags) == (None, None, None)
    assert tpu.TargetFlags.from_json(again.checked_flags) == flags


def test_the_check_on_a_node_uses_its_chips_for_the_target_they_are():
    one, four, two_slices = (parse_tpu_slice(t) for t in ("v5e:1x1", "v5e:2x2", "2xv5e:2x2"))
    chips = tpu.AttachedChips(("TPU v5 lite",), devices=4, local=4, processes=1, slices=1)
    assert tpu.attached_slice([one, four, two_slices], chips) == four
    assert tpu.attached_slice([one, two_slices], chips) is None
    assert tpu.attached_slice([two_slices], tpu.AttachedChips(("TPU v5 lite",), 8, 4, 2, 2)) is None, (
        "a multi-slice job is checked against compile-only devices")
    assert tpu.attached_slice([four], tpu.AttachedChips(("TPU v6 lite",), 4, 4, 1, 1)) is None
    assert tpu.attached_slice([four], tpu.AttachedChips(error="no chip")) is None


def test_one_target_of_a_list_gets_the_lists_options_for_it(tmp_path):
    """An Indexed Job's pod: --index keeps one target of the list, which runs as a single target does; the list's TPU
    flags are for its TPU targets, so a CPU target's pod does not refuse them."""
    listed = tmp_path / "targets.txt"
    listed.write_text("v5e:2x2\n1x1x2\n")
    proc = warmup("--targets", str(listed), "--index", "1", "--platform", "cpu", "--cache-dir", str(tmp_path / "c"),
                  "--entrypoint", EXAMPLE, "--libtpu-init-args=--xla_tpu_use_enhanced_launch_barrier=true",
                  "--dry-run", "--json")
    plan = json.loads(proc.stdout)
    assert (plan["topology"], plan["platform"], plan["dry_run"]) == ("1x1x2", "cpu", True)
