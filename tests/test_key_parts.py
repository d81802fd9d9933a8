"""What went into each key, captured by jaxcache.client from real JAX (both supported versions), in fresh
processes: the hash of every part, the program's entry signature, the XLA flags JAX hashed; that one change moves
only its own part; that none of it shows in the user's logs; and the exit summary's causes of misses.

The processes of one JAX version run side by side (tests/programs/parts_job.py), once per module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxcache import keyparts, records
from jaxcache.records import RunRecord

JOB = Path(__file__).parent / "programs" / "parts_job.py"
SLOW_FLAG = "--xla_cpu_enable_fast_math=false"
FAST_FLAG = "--xla_cpu_enable_fast_math=true"
ARGV_FLAG = "--xla_cpu_use_thunk_runtime=false"  # on the command line: JAX hashes it, XLA never reads it


def _env(extra: dict[str, str], xla_flags: str = SLOW_FLAG) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_", "XLA_"))}
    return {**env, "XLA_FLAGS": xla_flags, **extra}


def _start(python: str, env: dict[str, str], cache: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([python, str(JOB), "--cache-dir", str(cache), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{out}\n{err}"
    got = json.loads(out.strip().splitlines()[-1])
    got["record"] = records.parse(json.dumps(got["record"]).encode())
    got["stderr"] = err
    return got


def _by_signature(record: RunRecord) -> dict[tuple[str, tuple[str, ...]], records.KeyUsage]:
    keys = {}
    for usage in record.keys:
        assert usage.program is not None, usage
        keys[usage.function, usage.program.args] = usage
    assert len(keys) == len(record.keys), "two keys of one program and signature"
    return keys


@pytest.fixture(scope="module", params=["jax-main", "jax-next"])
def runs(request, tmp_path_factory) -> dict[str, dict]:
    """One JAX version's runs: ``base``, ``again`` (the same job), ``flags`` (another XLA_FLAGS value), ``argv``
    (an XLA flag on the command line) and ``devices`` (4 CPU devices, not 2), each on a cache of its own, all
    started at once."""
    if request.param == "jax-main":
        python, extra = sys.executable, {}
    else:
        python, extra = request.getfixturevalue("next_python_with_jaxcache")
    base = tmp_path_factory.mktemp(f"parts-{request.param}")
    started = {
        "base": _start(python, _env(extra), base / "base"),
        "again": _start(python, _env(extra), base / "again"),
        "flags": _start(python, _env(extra, FAST_FLAG), base / "flags"),
        "argv": _start(python, _env(extra), base / "argv", ARGV_FLAG),
        "devices": _start(python, _env(extra), base / "devices", "--devices", "4"),
    }
    return {name: _finish(proc) for name, proc in started.items()}


def test_every_lookup_carries_all_parts_a_signature_and_the_flags(runs):
    for name, run in runs.items():
        record = run["record"]
        assert len(record.keys) == 3, (name, record.keys)
        for usage in record.keys:
            assert usage.parts is not None and usage.parts.known() == list(keyparts.ORDER), (name, usage)
            assert usage.parts.options and len(usage.parts.options) <= keyparts.MAX_OPTIONS, (name, usage)
            assert usage.program is not None and usage.program.results, (name, usage)
        assert record.fingerprint.platform_version == "cpu"
        flags = {"flags": (FAST_FLAG,), "argv": (SLOW_FLAG, ARGV_FLAG)}.get(name, (SLOW_FLAG,))
        assert record.fingerprint.xla_flags == flags, name
    gram = next(u for u in runs["base"]["record"].keys if u.function == "jit_gram")
    assert gram.program == keyparts.ProgramSignature(args=("f32[3,4]",), results=("f32[3,3]",))


def test_two_runs_of_one_job_have_equal_parts(runs):
    base, again = runs["base"]["record"], runs["again"]["record"]
    assert {u.key: u.parts for u in base.keys} == {u.key: u.parts for u in again.keys}


def test_a_new_input_shape_changes_only_the_computation_and_the_signature_says_how(runs):
    keys = _by_signature(runs["base"]["record"])
    small, large = keys["jit_scale", ("f32[8]",)], keys["jit_scale", ("f32[16]",)]
    assert small.parts is not None and large.parts is not None and large.program and small.program
    assert large.parts.differing(small.parts) == [keyparts.COMPUTATION]
    assert large.program.changes(small.program) == ["argument 0: f32[8] → f32[16]", "result 0: f32[8] → f32[16]"]


@pytest.mark.parametrize(("variant", "parts"), [
    ("flags", [keyparts.XLA_FLAGS, keyparts.COMPILE_OPTIONS]),
    ("argv", [keyparts.XLA_FLAGS]),
    ("devices", [keyparts.DEVICES]),
])
def test_one_change_moves_only_its_own_parts(runs, variant, parts):
    """A flag in XLA_FLAGS moves two parts: JAX hashes the flag, and XLA reads it into the debug options of the
    compile options. One on the command line moves only the flags. The device count (a program on one device of
    2 or of 4) moves only the accelerator_config JAX hashes (the count's own XLA flag JAX leaves out of keys)."""
    base, other = _by_signature(runs["base"]["record"]), _by_signature(runs[variant]["record"])
    assert base.keys() == other.keys()
    for program, usage in base.items():
        theirs = other[program]
        assert usage.key != theirs.key and usage.parts is not None and theirs.parts is not None
        assert theirs.parts.differing(usage.parts) == parts, program
        if keyparts.COMPILE_OPTIONS in parts:  # named, with both values, where JAX hashed them
            assert theirs.parts.option_changes(usage.parts) == ["xla_cpu_enable_fast_math: false → true"], program
    differences = runs[variant]["record"].fingerprint.differences(runs["base"]["record"].fingerprint)
    if variant == "flags":
        assert differences["xla_flags"] == ((FAST_FLAG,), (SLOW_FLAG,))
    elif variant == "argv":
        assert differences["xla_flags"] == ((SLOW_FLAG, ARGV_FLAG), (SLOW_FLAG,))
    else:
        assert differences["device_count"] == (4, 2) and "xla_flags" not in differences


def test_the_capture_stays_out_of_the_users_logs(runs):
    """The jobs log at INFO through basicConfig (a handler on root that takes every level): the DEBUG records
    the client reads to capture parts must still not show, while the client's own INFO summary does."""
    for name, run in runs.items():
        err = run["stderr"]
        assert "jax._src.cache_key" not in err and "get_cache_key" not in err and "XLA flag" not in err, (name, err)
        assert "INFO jaxcache.client jaxcache: job" in err, (name, err)
        assert "did not log the parts" not in err and "WARNING" not in err, (name, err)


# --- one JAX: what it does without the parts, and the summary ---------------------------------------------------


def test_a_jax_that_logs_no_parts_says_so_once_at_info_and_records_the_rest(tmp_path):
    run = _finish(_start(sys.executable, _env({}), tmp_path / "cache", "--moved"))
    record = run["record"]
    assert len(record.keys) == 3 and all(u.event == records.WRITE and u.compiles == 1 for u in record.keys)
    assert all(u.parts is None and u.program is not None for u in record.keys), record.keys
    said = [line for line in run["stderr"].splitlines() if "did not log the parts" in line]
    assert len(said) == 1 and said[0].startswith("INFO jaxcache.client"), run["stderr"]
    assert "WARNING" not in run["stderr"] and record.fingerprint.xla_flags is None


def test_the_summary_names_the_causes_it_can_tell_and_the_explain_command(tmp_path):
    cache = tmp_path / "cache"
    first = _finish(_start(sys.executable, _env({}), cache, "--programs", "scale8"))
    (written,) = first["record"].keys
    entry = cache / f"{written.key}-cache"
    entry.write_bytes(entry.read_bytes()[:20])  # torn: JAX warns, recompiles, never rewrites it
    old = time.time() - 600
    os.utime(entry, (old, old))

    # scale8: its entry is unreadable; shift: new, written; gram: under a threshold raised to 60 s.
    run = _finish(_start(sys.executable, _env({}), cache, "--programs", "scale8,shift",
                         "--then-min-compile-s", "60", "--then", "gram"))
    summary, run_id = run["summary"], run["run_id"]
    assert "3 misses" in summary, summary
    assert "1 not written, as JAX said (1: compiled in" in summary, summary
    assert "under jax_persistent_cache_min_compile_time_secs=60)" in summary, summary
    assert "1 unreadable (the entry is in the cache but JAX could not load it" in summary, summary
    assert f"remove it: rm -f {entry} " in summary, "the fix removes exactly that entry"
    assert summary.endswith(f"1 to explain: jaxcache explain {cache} --run {run_id}"), summary
    assert summary in run["stderr"], "the summary logged at exit says the same"


# --- the capture itself, fed JAX's records by hand -----------------------------------------------------------


def _log(capture, text, *args) -> None:
    import logging

    capture.on_log(logging.LogRecord("jax._src.cache_key", logging.DEBUG, "", 0, text.prefix, args, None))


def _hash_key(capture, seed: str, flags: tuple[str, ...] = ()) -> str:
    """Log one key's parts as JAX does at DEBUG (flags twice: JAX hashes each part twice then); its hash."""
    import hashlib

    from jaxcache.client import jax_internals as ji

    so_far = ""
    for label in ji.PART_LABELS:
        if label == "XLA flags":
            for flag in flags + flags:
                _log(capture, ji.FLAG_MSG, flag)
        _log(capture, ji.PART_MSG, label, hashlib.sha256(f"{seed}/{label}".encode()).hexdigest())
        so_far = hashlib.sha256(f"{so_far}{seed}/{label}".encode()).hexdigest()
        _log(capture, ji.SO_FAR_MSG, label, so_far)
    return so_far


def test_parts_go_to_the_key_they_hash_to_on_their_own_thread():
    import threading

    from jaxcache.client.keycapture import KeyCapture

    capture = KeyCapture()
    first = _hash_key(capture, "a", ("--xla_a=1", "--xla_a=1", "--xla_b=2"))
    second = _hash_key(capture, "b")  # two keys before one lookup, as JAX computes them with PGLE
    capture.on_key(f"jit_f-{second}", keyparts.ProgramSignature(args=("f32[2]",)))
    parts, program = capture.take(f"jit_f-{second}")
    assert parts is not None and parts.known() == list(keyparts.ORDER) and program is not None
    assert capture.xla_flags == ()  # the last key's flags: none
    assert capture.take(f"jit_f-{first}") == (None, None), "what was not looked up is dropped at a lookup"

    first = _hash_key(capture, "a", ("--xla_a=1", "--xla_a=1", "--xla_b=2"))
    assert capture.xla_flags == ("--xla_a=1", "--xla_a=1", "--xla_b=2"), "a flag given twice is hashed twice"
    seen: list[object] = []
    other = threading.Thread(target=lambda: seen.append(capture.take(f"jit_f-{first}")))
    other.start()
    other.join()
    assert seen == [(None, None)], "another thread's lookup takes nothing of this thread's key"
    parts, program = capture.take(f"jit_f-{first}")
    assert parts is not None and parts.computation is not None and program is None


def test_a_summary_without_misses_says_nothing_of_causes():
    from jaxcache.client.misses import MissCauses

    assert MissCauses(misses=0).describe("/c", "r") == ""
    causes = MissCauses(misses=2, not_written=(("only process 0 writes the cache", 2),))
    assert causes.unexplained == 0 and "explain" not in causes.describe("/c", "r")
    assert "jaxcache explain '/a b' --run r" in MissCauses(misses=1).describe("/a b", "r")


def test_the_compile_options_a_key_records_are_bounded_and_keep_long_values_apart():
    """Real CompileOptions with more overrides than a record keeps, two of them long values that share a start."""
    from jaxlib import xla_client

    from jaxcache.client.jax_internals.compile_options import hashed_fields

    options = xla_client.CompileOptions()
    long_a, long_b = "x" * 300 + "a", "x" * 300 + "b"
    options.env_option_overrides = [(f"xla_opt_{i:03}", str(i)) for i in range(100)] + [
        ("xla_aa_long", long_a), ("xla_ab_long", long_b)]
    fields = dict(hashed_fields(options, "cpu") or ())
    assert len(fields) == keyparts.MAX_OPTIONS and fields[keyparts.MORE] == "39 more not recorded"
    left_out = keyparts.KeyParts(options=tuple(sorted(fields.items())))
    listed = {**{n: v for n, v in fields.items() if n != keyparts.MORE}, "compiler_options.xla_opt_099": "99"}
    assert left_out.option_changes(keyparts.KeyParts(options=tuple(sorted(listed.items())))) == [
        "compiler_options.xla_opt_099: 99 → (not recorded)"], "an option left out is not claimed as its default"
    assert all(len(n) <= keyparts.MAX_OPTION_TEXT and len(v) <= keyparts.MAX_OPTION_TEXT for n, v in fields.items())
    a, b = fields["compiler_options.xla_aa_long"], fields["compiler_options.xla_ab_long"]
    assert a != b and a.startswith("x" * 50) and "#" in a
    named = dict(hashed_fields(xla_client.CompileOptions(), "cpu", ("--xla_cpu_enable_fast_math=false",)) or ())
    assert named == {"xla_cpu_enable_fast_math": "false"}, "an option a flag names is kept even at its default"
    record = records.KeyUsage(key="jit_f-" + "a" * 64, event="hit",
                              parts=keyparts.KeyParts(options=tuple(sorted(fields.items()))))
    assert records.parse(records.RunRecord(job="j", run_id="r", process_index=0, process_count=1, host="h",
                                           started_at=1.0, updated_at=1.0, fingerprint=records.Fingerprint(
                                               jax="0.10.2", jaxlib="0.10.2"), keys=[record]).to_json())
