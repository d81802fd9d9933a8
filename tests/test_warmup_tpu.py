"""`warmup --platform tpu`: slice names, their one spelling in records and the service, bad input, and (with libtpu,
in the interpreter `make test` builds, JAXCACHE_TPU_PYTHON) real compile-only warm-ups for a TPU slice from this CPU
machine: what enters the key, the key itself against plain JAX's, re-runs, --check, flags from a job's records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxcache import coverage, records
from jaxcache.errors import InvalidInputError
from jaxcache.topology import parse_any_topology, parse_tpu_slice
from jaxcache.warmup import devices as dev

PROGRAMS = Path(__file__).parent / "programs"
EXAMPLE = "jaxcache.warmup.examples:warm"
BARRIER = "--xla_tpu_use_enhanced_launch_barrier=true"


# Plain JAX compiling for a slice without a chip, into the cache named by its first argument, configured as
# enable_cache() configures it: what a job's own process computes for a key.
PLAIN_JAX = """
import os, sys
os.environ.update(TPU_SKIP_MDS_QUERY="1", TPU_WORKER_HOSTNAMES="localhost", JAX_PLATFORMS="cpu",
                  ALLOW_MULTIPLE_LIBTPU_LOAD="1")
import jax
for name, value in (("jax_compilation_cache_dir", sys.argv[1]), ("jax_persistent_cache_min_compile_time_secs", 0),
                    ("jax_persistent_cache_min_entry_size_bytes", -1),
                    ("jax_persistent_cache_enable_xla_caches", "none")):
    jax.config.update(name, value)
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAXCACHE_", "JAX_COMPILATION_CACHE", "LIBTPU_INIT_ARGS", "XLA_FLAGS", "TPU_"))}
    env.update(extra)
    return env


def warmup(*args: str, python: str = sys.executable, expect: int | None = 0,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([python, "-m", "jaxcache.warmup", *args], capture_output=True, text=True, timeout=300,
                          cwd=PROGRAMS, env=clean_env(**(env or {})))
    if expect is not None:
        assert proc.returncode == expect, f"exit {proc.returncode}, expected {expect}\n{proc.stdout}\n{proc.stderr}"
    return proc


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("warmup:")]


# --- slice names, without libtpu ------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "chips", "hosts", "per_host", "spelling"), [
    ("v5e:1x1", 1, 1, (1, 1, 1), "v5e:1x1"),
    ("v5e:2x2", 4, 1, (2, 2, 1), "v5e:2x2"),
    ("v5e:4x8", 32, 8, (2, 2, 1), "v5e:4x8"),
    ("V5E:4x8@2x2x1", 32, 8, (2, 2, 1), "v5e:4x8"),
    ("v5e:2x4@2x4", 8, 1, (2, 4, 1), "v5e:2x4@2x4x1"),
    ("v5p:2x2x2", 8, 2, (2, 2, 1), "v5p:2x2x2"),
    ("v6e:4x4", 16, 4, (2, 2, 1), "v6e:4x4"),
])
def test_slice_names_and_their_one_spelling(name, chips, hosts, per_host, spelling):
    s = parse_tpu_slice(name)
    assert (s.chips, s.hosts, s.chips_per_host, str(s)) == (chips, hosts, per_host, spelling)
    assert s.global_devices == chips and s.processes == hosts
    assert str(parse_any_topology(str(s))) == spelling


def test_chips_per_host_override_and_wraparound():
    assert parse_tpu_slice("v5e:2x4", "2x4").chips_per_host == (2, 4, 1)
    assert parse_tpu_slice("v5e:16x16").wrap == (True, True, False)  # the standard v5e-256 is a torus in two axes
    with pytest.raises(InvalidInputError, match="do not divide into hosts"):
        parse_tpu_slice("v5e:2x4", "3x3")


@pytest.mark.parametrize(("name", "why"), [
    ("v5e:3x3", "v5e makes no 3x3 slice"), ("v5e:4x8x1", "v5e makes no 4x8x1"), ("v5p:3x4x4", "v5p makes no"),
    ("v4:2x2x1", "v4 is not supported yet"), ("tpu:2x2", "not a TPU slice name"), ("v5e:", "not a TPU slice name"),
])
def test_wrong_slice_names_name_the_valid_forms(name, why):
    with pytest.raises(InvalidInputError, match=why) as info:
        parse_tpu_slice(name)
    assert "v5e:AxB or v6e:AxB" in str(info.value) and "\n" not in str(info.value)


def test_warmup_records_keep_the_tpu_spelling():
    fp = records.Fingerprint(jax="0.10.2", jaxlib="0.10.2")
    record = coverage.WarmupRecord(id="20261205T000000Z-abcd1234", job="w", topology="V5E:4x8@2x2x1",
                                   platform="tpu", started_at=1.0, finished_at=2.0, fingerprint=fp, cache_dir="/c")
    assert record.topology == "v5e:4x8"
    assert coverage.WarmupRecord(id="20261205T000000Z-abcd1234", job="w", topology="1X1X4", platform="cpu",
                                 started_at=1.0, finished_at=2.0, fingerprint=fp, cache_dir="/c").topology == "1x1x4"


def test_tpu_plan_needs_a_slice_name():
    with pytest.raises(InvalidInputError, match="takes a TPU slice name"):
        dev.plan_backend(parse_any_topology("1x1x4"), "tpu", None)
    with pytest.raises(InvalidInputError, match="use --platform tpu"):
        dev.plan_backend(parse_tpu_slice("v5e:2x2"), "cpu", None)


@pytest.mark.parametrize(("args", "message"), [
    (["--topology", "v5e:3x3"], "v5e makes no 3x3 slice"),
    (["--platform", "tpu", "--topology", "4x8x1"], "is not a TPU slice name"),
    (["--platform", "cpu", "--topology", "1x1x1", "--chips-per-host", "2x2"], "are for --platform tpu"),
    (["--topology", "v5e:2x2", f"--libtpu-init-args={BARRIER}", "--flags-from-job", "j"], "not both"),
])
def test_bad_tpu_input_exit_2_one_line_nothing_written(tmp_path, args, message):
    cache = tmp_path / "c"
    proc = warmup(*args, "--cache-dir", str(cache), "--entrypoint", EXAMPLE, expect=2)
    lines = error_lines(proc)
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not cache.exists() or not any(cache.rglob("*-cache"))


def test_script_refused_for_a_slice(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    proc = warmup("--platform", "tpu", "--topology", "v5e:2x2", "--cache-dir", str(tmp_path / "c"), "--script",
                  str(script), expect=2)
    lines = error_lines(proc)
    assert len(lines) == 1 and "this host's CPUs" in lines[0] and "never runs" not in proc.stdout


def _works_from_a_clone(command: str) -> None:
    """`pip install ./core './warmup[tpu]'`: each argument is a part's folder in this checkout, and each extra it
    names is one of that part's (jaxcache's parts are on no package index: a distribution's name installs
    nothing)."""
    import shlex
    import tomllib

    words = shlex.split(command)
    assert words[:2] == ["pip", "install"] and len(words) > 2, command
    for word in words[2:]:
        folder, _, extras = word.partition("[")
        assert folder.startswith("./"), f"{word}: not a folder of the clone"
        project = tomllib.loads((Path(__file__).parents[1] / folder / "pyproject.toml").read_text())["project"]
        for extra in filter(None, extras.rstrip("]").split(",")):
            assert extra in project.get("optional-dependencies", {}), f"{word}: {project['name']} has no {extra!r}"


def test_without_libtpu_one_line_says_how_to_install(tmp_path):
    import importlib.metadata
    import importlib.util
    import re

    from jaxcache.warmup.cli import build_parser

    if importlib.util.find_spec("libtpu") is not None:
        pytest.skip("libtpu is installed in this interpreter")
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", str(tmp_path / "c"), "--entrypoint", EXAMPLE, expect=2)
    lines = error_lines(proc)
    assert len(lines) == 1, proc.stderr
    # What works wherever jaxcache is installed (an image too): the libtpu this JAX pins, through JAX's own extra.
    jax = importlib.metadata.version("jax")
    assert f"pip install 'jax[tpu]=={jax}'" in lines[0]
    assert "tpu" in (importlib.metadata.metadata("jax").get_all("Provides-Extra") or [])
    # And from a clone, the warm-up's extra: --help names the same commands.
    clone = re.search(r"from a jaxcache clone (pip install [^;]*\S)", lines[0])
    assert clone is not None, lines[0]
    _works_from_a_clone(clone[1])
    helped = " ".join(build_parser().format_help().split())
    assert f"pip install 'jax[tpu]=={jax}'" in helped and f"from a jaxcache clone {clone[1]}" in helped, helped
    assert "jaxcache-warmup[" not in lines[0] + helped


# --- real compile-only warm-ups, with libtpu ------------------------------------------------------------------


@pytest.fixture(scope="session")
def tpu_python() -> str:
    python = os.environ.get("JAXCACHE_TPU_PYTHON", "")
    if not python or not os.path.exists(python):
        pytest.skip("no interpreter with libtpu: JAXCACHE_TPU_PYTHON is unset or missing (`make test` builds"
                    " .venv-tpu with pip install ./core ./client './warmup[tpu]'; it needs the 213 MB libtpu wheel)")
    return python


@pytest.fixture(scope="session")
def warmed(tpu_python, tmp_path_factory) -> dict:
    """One warm-up of the example for v5e:2x2 with the lent chip's flag, shared by the tests below."""
    cache = tmp_path_factory.mktemp("tpu") / "cache"
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", str(cache), "--entrypoint", EXAMPLE, "--job", "tpu-warm",
                  f"--libtpu-init-args={BARRIER}", python=tpu_python)
    return {"cache": cache, "proc": proc}


def test_tpu_warmup_prints_what_enters_the_key_and_records_the_slice(warmed):
    out = warmed["proc"].stdout
    assert "v5e:2x2: 4 chips, 1 host(s) of 2x2x1 (Cloud TPU's standard shape" in out
    assert f"LIBTPU_INIT_ARGS {BARRIER}" in out and "XLA_FLAGS        (unset)" in out
    assert "libtpu          0.0.42" in out and "compression     zstandard" in out
    [name] = (warmed["cache"] / ".jaxcache" / "warmups").iterdir()
    data = json.loads(name.read_text())
    assert data["topology"] == "v5e:2x2" and data["platform"] == "tpu"
    fp = data["fingerprint"]
    assert (fp["backend"], fp["device_kind"], fp["device_count"], fp["process_count"]) == ("tpu", "TPU v5 lite", 4, 1)
    assert fp["xla_flags"] == [BARRIER]
    assert [p["status"] for p in data["programs"]] == ["written"]


def test_tpu_key_is_plain_jaxs_with_the_jobs_flags(warmed, tpu_python, tmp_path):
    """A job that sets LIBTPU_INIT_ARGS itself computes the same key as the warm-up given --libtpu-init-args."""
    code = PLAIN_JAX + """
from jax.experimental import topologies
from jaxcache.topology import parse_tpu_slice
from jaxcache.warmup import examples
from jaxcache.warmup.context import WarmupContext
s = parse_tpu_slice("v5e:2x2")
devices = topologies.get_topology_desc(topology_name=s.name, platform="tpu", chips_per_host_bounds=(2, 2, 1)).devices
examples.warm(WarmupContext(s, "tpu", None, list(devices)))
"""
    plain = tmp_path / "plain"
    env = clean_env(LIBTPU_INIT_ARGS=BARRIER)
    proc = subprocess.run([tpu_python, "-c", code, str(plain)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    theirs = {p.name for p in plain.iterdir() if p.name.endswith("-cache")}
    ours = {p.name for p in warmed["cache"].iterdir() if p.name.endswith("-cache")}
    assert theirs and theirs == ours


def test_tpu_rerun_is_already_warm_without_load_warnings(warmed, tpu_python):
    cache = str(warmed["cache"])
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", cache, "--entrypoint", EXAMPLE, "--json",
                  f"--libtpu-init-args={BARRIER}", python=tpu_python)
    summary = json.loads(proc.stdout)
    assert (summary["written"], summary["already_warm"]) == (0, summary["programs"])
    assert "error" not in proc.stderr and "Error reading persistent compilation cache entry" not in proc.stderr
    assert "already present" in proc.stderr and "could not load" not in proc.stderr


def test_tpu_verify_loads_in_a_fresh_process_while_the_warmup_runs(tpu_python, tmp_path):
    """--verify's process starts libtpu while the warm-up's still holds it: libtpu's one-process lock (for a chip
    this machine does not have) must not stop it."""
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", str(tmp_path / "c"), "--entrypoint", EXAMPLE, "--verify",
                  "--json", python=tpu_python)
    assert json.loads(proc.stdout)["verify"]["ok"] is True, proc.stderr[-2000:]


def test_tpu_check_hits_and_explains_other_flags(warmed, tpu_python):
    cache = str(warmed["cache"])
    ok = warmup("--topology", "v5e:2x2", "--cache-dir", cache, "--entrypoint", EXAMPLE, "--check", "--json",
                f"--libtpu-init-args={BARRIER}", python=tpu_python)
    s = json.loads(ok.stdout)
    assert s["programs"] and s["hits"] == s["programs"] and s["topology"] == "v5e:2x2"
    miss = warmup("--topology", "v5e:2x2", "--cache-dir", cache, "--entrypoint", EXAMPLE, "--check", "--json",
                  python=tpu_python, expect=1)
    s = json.loads(miss.stdout)
    assert s["hits"] == 0 and s["misses"] and all(m["function"] for m in s["misses"])


def record(cache: Path, job: str, run_id: str, flags: tuple[str, ...] | None, *, at: float | None = None) -> Path:
    """A process-0 run record of ``job`` listing ``flags`` as those JAX hashed, as a job or anyone who can write
    the bucket would put it."""
    at = time.time() if at is None else at
    fp = records.Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="tpu", xla_flags=flags)
    rec = records.RunRecord(job=job, run_id=run_id, process_index=0, process_count=1, host="h", started_at=at,
                            updated_at=at, fingerprint=fp)
    path = cache / rec.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(rec.to_json())
    os.utime(path, (at, at))
    return path


def test_flags_from_a_jobs_run_record(tpu_python, tmp_path):
    cache = tmp_path / "c"
    record(cache, "pretrain", "r1", (BARRIER, "--xla_dump_hlo_as_text"))
    record(cache, "nokeyparts", "r2", None)
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", str(cache), "--entrypoint", EXAMPLE, "--dry-run", "--json",
                  "--flags-from-job", "pretrain", python=tpu_python)
    plan = json.loads(proc.stdout)
    assert plan["libtpu_init_args"] == [BARRIER] and plan["xla_flags"] == []
    assert plan["flags_not_taken"] == ["--xla_dump_hlo_as_text"]  # JAX leaves it out of the key
    assert plan["flags_from"] == "run r1 of job 'pretrain'" and plan["chips_per_host"] == "2x2x1"
    assert plan["flags_checked"] == "here"
    for job, why in (("nokeyparts", "lists the flags JAX hashed"), ("nobody", "has no run record")):
        bad = warmup("--topology", "v5e:2x2", "--cache-dir", str(cache), "--entrypoint", EXAMPLE, "--dry-run",
                     "--flags-from-job", job, python=tpu_python, expect=2)
        lines = error_lines(bad)
        assert len(lines) == 1 and why in lines[0] and "--libtpu-init-args" in lines[0], bad.stderr


# --- flags from a record are not the warm-up's to trust (#58 item 2) ------------------------------------------------


def test_a_planted_records_dump_flags_are_not_taken_and_its_flags_are_shown_escaped(tpu_python, tmp_path):
    """The red team's record: dump flags that would copy the programs' text into the shared root, and a value that
    rewrites the terminal's line and title. JAX leaves dump flags out of the key, so they are not taken; every flag
    printed is escaped."""
    cache = tmp_path / "c"
    stolen = cache / "stolen"
    hostile = "--xla_dump_hlo_module_re=.*\x1b[2K\x1b]0;owned\x07"
    flags = (BARRIER, f"--xla_dump_to={stolen}", f"-xla_dump_to={stolen}", "--xla_dump_hlo_as_text", hostile)
    record(cache, "pretrain", "r1", flags)
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", str(cache), "--entrypoint", EXAMPLE, "--flags-from-job",
                  "pretrain", "--job", "tpu-warm", python=tpu_python)
    assert not stolen.exists() and not list(cache.rglob("*.txt")), sorted(cache.rglob("*"))
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout + proc.stderr
    assert f"LIBTPU_INIT_ARGS {BARRIER}" in proc.stdout and "XLA_FLAGS        (unset)" in proc.stdout
    assert f"not taken        --xla_dump_to={stolen} -xla_dump_to={stolen} --xla_dump_hlo_as_text" in proc.stdout
    assert "--xla_dump_hlo_module_re=.*\\x1b[2K\\x1b]0;owned\\x07" in proc.stdout, proc.stdout
    [warm] = (cache / ".jaxcache" / "warmups").iterdir()
    assert json.loads(warm.read_text())["fingerprint"]["xla_flags"] == [BARRIER]


@pytest.mark.parametrize("flag", [
    "--xla_gpu_per_fusion_autotune_cache_dir=/etc/jaxcache-stolen",
    "--xla_tpu_profile_dir=gs://attacker/x",
    "--xla_gpu_kernel_cache_file=~/cache",
    "--xla_tpu_sdc_paths=a,/etc/passwd",
    "--xla_tpu_profile_dir=../../mnt/cache/stolen",
    "--xla_tpu_profile_dir=mnt/cache/stolen",
])
def test_a_records_flag_whose_value_is_a_path_or_url_is_refused(tmp_path, flag):
    """Refused in one line naming it, before libtpu is needed: the record decides no place to read or write."""
    cache = tmp_path / "c"
    record(cache, "pretrain", "r1", (BARRIER, flag + "\x1b[2K"))
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", str(cache), "--entrypoint", EXAMPLE, "--dry-run",
                  "--flags-from-job", "pretrain", expect=2)
    lines = error_lines(proc)
    assert len(lines) == 1 and f"lists {flag}\\x1b[2K, whose value is a path or a URL" in lines[0], lines


@pytest.mark.parametrize("flag", ["--xla_jf_dump_to=stolen", "--xla_mosaic_dump_to=stolen"])
def test_a_records_dump_flag_that_enters_the_key_is_refused(tmp_path, flag):
    """libtpu's dump flags are not on JAX's list (they enter the key), and a bare name is a folder where it runs."""
    cache = tmp_path / "c"
    record(cache, "pretrain", "r1", (BARRIER, flag))
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", str(cache), "--entrypoint", EXAMPLE, "--dry-run",
                  "--flags-from-job", "pretrain", expect=2)
    lines = error_lines(proc)
    assert len(lines) == 1 and f"lists {flag}, a dump flag" in lines[0], lines


@pytest.mark.parametrize(("space", "shown"), [(" ", " "), ("\r", "\\x0d")], ids=["space", "carriage return"])
def test_a_records_flag_that_would_split_into_two_is_refused(tmp_path, space, shown):
    """JAX and XLA split their variables on whitespace: one recorded "flag" must not smuggle in a second one."""
    cache = tmp_path / "c"
    record(cache, "pretrain", "r1", (BARRIER, f"--xla_tpu_x=1{space}--xla_dump_to=stolen"))
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", str(cache), "--entrypoint", EXAMPLE, "--dry-run",
                  "--flags-from-job", "pretrain", expect=2)
    lines = error_lines(proc)
    assert len(lines) == 1 and f"'--xla_tpu_x=1{shown}--xla_dump_to=stolen', which is not one flag" in lines[0], lines


@pytest.mark.parametrize(("flag", "said"), [
    ("--xla_tpu_use_enhanced_launch_barrier=maybe", "Illegal value 'maybe'"),  # libtpu's, in LIBTPU_INIT_ARGS
    ("--xla_cpu_enable_fast_math=maybe", "Couldn't interpret value maybe"),  # this process's XLA's, in XLA_FLAGS
    ("--xla_tpu_no_such_flag=1", "Unknown command line flag 'xla_tpu_no_such_flag'"),
])
def test_a_flag_value_xla_would_abort_on_is_one_line_and_exit_2(tpu_python, tmp_path, flag, said):
    cache = tmp_path / "c"
    record(cache, "pretrain", "r1", (flag,))
    proc = warmup("--topology", "v5e:2x2", "--cache-dir", str(cache), "--entrypoint", EXAMPLE, "--flags-from-job",
                  "pretrain", python=tpu_python, expect=2)
    lines = error_lines(proc)
    assert len(lines) == 1 and said in lines[0] and "run r1 of job 'pretrain'" in lines[0], proc.stderr
    assert "Check failed" not in proc.stderr and "Traceback" not in proc.stderr
    assert not any(cache.rglob("*-cache")) and not (cache / ".jaxcache" / "warmups").exists()


def test_flags_from_job_reads_the_newest_days_first_and_stops_at_the_first_answer(tmp_path):
    """A root of many records answers from its newest: older days are never listed, other records never read."""
    from jaxcache.storage import open_storage
    from jaxcache.warmup import tpu

    cache = tmp_path / "c"
    day = 86400.0
    now = time.time()
    for i in range(200):  # three days ago: other jobs, and this job's older runs
        record(cache, "pretrain" if i % 10 == 0 else f"other{i}", f"old{i}", ("--xla_tpu_old=true",),
               at=now - 3 * day + i)
    for i in range(5):  # today: the newest names the flags
        record(cache, "pretrain", f"new{i}", (BARRIER,) if i == 4 else None, at=now - 60 + i)
    storage = open_storage(cache)
    flags = tpu.flags_from_job(storage, "pretrain")
    assert flags.libtpu_init_args == (BARRIER,) and flags.source == "run new4 of job 'pretrain'"
    assert storage.reads <= 5, storage.reads  # today's records at most, not the 200 older ones
    assert tpu.flags_from_job(open_storage(cache), "pretrain").source == "run new4 of job 'pretrain'"


def test_a_command_of_several_tpu_targets_reads_and_checks_their_flags_once(tpu_python, tmp_path):
    """The command reads the job's records and checks the flags once; each target's process takes them as handed,
    with where they came from. Here the entrypoint's import deletes the records: the second target's process
    (--parallel 1) would find none, were it to read them again."""
    cache = tmp_path / "c"
    record(cache, "pretrain", "r1", (BARRIER,))
    (tmp_path / "forgets_runs.py").write_text(
        "import os, shutil\n"
        "shutil.rmtree(os.environ['FORGET_RUNS'], ignore_errors=True)\n"
        "from jaxcache.warmup.examples import warm  # noqa: F401\n")
    proc = warmup("--topology", "v5e:2x2", "--topology", "v5e:1x1", "--cache-dir", str(cache), "--entrypoint",
                  "forgets_runs:warm", "--flags-from-job", "pretrain", "--parallel", "1", "--dry-run", "--json",
                  python=tpu_python, env={"PYTHONPATH": str(tmp_path), "FORGET_RUNS": str(cache / ".jaxcache")},
                  expect=None)
    out = json.loads(proc.stdout)
    assert [(t["target"], t["exit"], t["errors"]) for t in out["targets"]] == [("v5e:2x2", 0, []),
                                                                                ("v5e:1x1", 0, [])], proc.stdout
    plans = [t["summary"] for t in out["targets"]]
    assert all((p["flags_from"], p["libtpu_init_args"], p["flags_checked"]) == (
        "run r1 of job 'pretrain'", [BARRIER], "by the command") for p in plans), plans
    assert not (cache / ".jaxcache").exists(), "the first target's process ran the entrypoint's import"


def test_the_flags_a_command_hands_a_targets_process_travel_whole():
    from jaxcache.warmup import tpu

    flags = tpu.TargetFlags(("--xla_x=1",), (BARRIER, "--xla_tpu_y=\x1b[2K"), "run r1 of job 'p\u00e9'",
                            ("--xla_dump_to=/x",))
    assert flags.to_json().isascii() and tpu.TargetFlags.from_json(flags.to_json()) == flags
    for text in ("{}", "[]", "not json", '{"xla_flags": [1], "libtpu_init_args": [], "left_out": [], "source": "s"}'):
        with pytest.raises(InvalidInputError, match="--checked-flags: not the target's flags"):
            tpu.TargetFlags.from_json(text)


def test_single_chip_has_its_own_host_bounds(tpu_python, tmp_path):
    proc = warmup("--topology", "v5e:1x1", "--cache-dir", str(tmp_path / "c"), "--entrypoint", EXAMPLE, "--json",
                  python=tpu_python)
    assert json.loads(proc.stdout)["written"] == 1
    assert "1 chips, 1 host(s) of 1x1x1" in proc.stderr  # with --json, what is printed goes to stderr


def test_entrypoint_gets_the_slices_chips(tpu_python, tmp_path):
    """ctx.devices(), ctx.mesh(), ctx.abstract() and ctx.compile() work unchanged on a slice: its chips, not this
    machine's CPU."""
    proc = warmup("--topology", "v5e:4x4", "--cache-dir", str(tmp_path / "c"), "--entrypoint",
                  "warm_targets:tpu_mesh", python=tpu_python)
    assert "slice v5e:4x4 chips 16 devices 16 kinds ['TPU v5 lite']" in proc.stdout
    assert "compiled for 16 devices" in proc.stdout and "16 chips, 4 host(s) of 2x2x1" in proc.stdout


def test_gpu_probe_leaves_libtpu_alone(tpu_python):
    """With libtpu installed, a probe that allowed every platform would start it (a metadata server query, this
    host's chips claimed): the probe asks for CUDA's backend only."""
    gpus = dev.probe_gpus(python=tpu_python)
    assert gpus.count == 0 and gpus.error, gpus
    assert "tpu" not in gpus.tried and "cpu" in gpus.tried, gpus


def test_service_lists_and_filters_tpu_spellings(warmed, tmp_path):
    from fastapi.testclient import TestClient

    from jaxcache.service.app import create_app
    from jaxcache.service.settings import ServiceSettings

    app = create_app(ServiceSettings(caches={"c": str(warmed["cache"])}, db=f"sqlite:///{tmp_path / 'cat.sqlite'}",
                                     insecure_no_auth=True))
    with TestClient(app) as client:
        assert client.post("/v1/caches/c/rescan").status_code == 200
        listed = client.get("/v1/caches/c/warmups").json()["warmups"]
        # The re-run test may have added a record of its own: every one is the slice's.
        assert listed and {(w["topology"], w["platform"]) for w in listed} == {("v5e:2x2", "tpu")}
        keys = {p.name.rsplit("-", 1)[0].rsplit("-", 1)[1] for p in warmed["cache"].iterdir()
                if p.name.endswith("-cache")}
        for spelling in ("v5e:2x2", "V5E:2x2@2x2x1"):
            got = client.get(f"/v1/caches/c/entries?topology={spelling}").json()["entries"]
            assert {e["key"].rsplit("-", 1)[-1] for e in got} == keys, spelling
        assert client.get("/v1/caches/c/entries?topology=1x1x4").json()["entries"] == []


# --- multi-slice jobs: N slices over the data-centre network, compile-only -------------------------------------


def test_multislice_spelling_is_one_word():
    s = parse_tpu_slice("2xV5E:16x16")
    assert (str(s), s.name, s.slices, s.chips, s.hosts, s.global_devices, s.processes) == (
        "2xv5e:16x16", "v5e:16x16", 2, 256, 64, 512, 128)
    assert str(parse_tpu_slice("v5e:16x16", num_slices=2)) == "2xv5e:16x16"
    assert str(parse_tpu_slice("1xv5e:2x2")) == "v5e:2x2" and str(parse_any_topology("3xv5e:2x4@2x4")) == \
        "3xv5e:2x4@2x4x1"
    for name, why in (("2xv5e:2x2", "names 2 slices, --num-slices says 3"), ("0xv5e:2x2", "0 slices"),
                      ("5000xv5e:2x2", "a multi-slice job has 1 to 1024"), ("2xv4:2x2x1", "v4 is not supported")):
        with pytest.raises(InvalidInputError, match=why):
            parse_tpu_slice(name, num_slices=3 if name == "2xv5e:2x2" else None)
    fp = records.Fingerprint(jax="0.10.2", jaxlib="0.10.2")
    record = coverage.WarmupRecord(id="20261205T000000Z-abcd1234", job="w", topology="2XV5E:4x8@2x2x1",
                                   platform="tpu", started_at=1.0, finished_at=2.0, fingerprint=fp, cache_dir="/c")
    assert record.topology == "2xv5e:4x8"


@pytest.fixture(scope="session")
def multislice(tpu_python, warmed, tmp_path_factory) -> dict:
    """The example warmed for two v5e:2x2 slices (--num-slices beside one --topology), with warmed's flag."""
    cache = tmp_path_factory.mktemp("tpu-multislice") / "cache"
    proc = warmup("--topology", "v5e:2x2", "--num-slices", "2", "--cache-dir", str(cache), "--entrypoint", EXAMPLE,
                  "--job", "tpu-multislice", f"--libtpu-init-args={BARRIER}", python=tpu_python)
    return {"cache": cache, "proc": proc}


def keys_in(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if p.name.endswith("-cache")}


def test_a_two_slice_program_compiles_for_every_slices_chips(multislice):
    out = multislice["proc"].stdout
    assert "2 slices of v5e:2x2 over the data-centre network (8 devices), each 4 chips, 1 host(s) of 2x2x1" in out
    [name] = (multislice["cache"] / ".jaxcache" / "warmups").iterdir()
    data = json.loads(name.read_text())
    assert data["topology"] == "2xv5e:2x2" and [p["status"] for p in data["programs"]] == ["written"]
    fp = data["fingerprint"]
    assert (fp["device_count"], fp["local_device_count"], fp["process_count"]) == (8, 4, 2)
    assert "megascale" in fp["platform_version"], "libtpu names a multi-slice job's runtime"


def test_a_two_slice_key_differs_from_the_one_slice_key(multislice, warmed):
    assert keys_in(multislice["cache"]) and keys_in(warmed["cache"])
    assert not keys_in(multislice["cache"]) & keys_in(warmed["cache"])


def test_a_two_slice_rerun_finds_it_warm(multislice, tpu_python):
    proc = warmup("--topology", "2xv5e:2x2", "--cache-dir", str(multislice["cache"]), "--entrypoint", EXAMPLE,
                  "--json", f"--libtpu-init-args={BARRIER}", python=tpu_python)
    summary = json.loads(proc.stdout)
    assert summary["topology"] == "2xv5e:2x2" and (summary["written"], summary["already_warm"]) == (0, 1)


def test_a_two_slice_key_is_a_jobs_with_jaxs_hybrid_mesh(multislice, tpu_python, tmp_path):
    """A multi-slice job builds its mesh with mesh_utils.create_hybrid_device_mesh, as MaxText does: plain JAX
    compiling the example that way computes the warm-up's key."""
    code = PLAIN_JAX + """
from jax.experimental import mesh_utils, topologies
from jax.sharding import Mesh
from jaxcache.warmup import examples
devices = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu", chips_per_host_bounds=(2, 2, 1),
                                       num_slices=2).devices
mesh = Mesh(mesh_utils.create_hybrid_device_mesh((4,), (2,), devices), ("data",))
step, params_sharding, by_batch = examples.train_step(mesh)
s = examples.shapes(8)
params = {n: jax.ShapeDtypeStruct(s[n], "float32", sharding=params_sharding[n]) for n in params_sharding}
x, y = (jax.ShapeDtypeStruct(s[n], "float32", sharding=by_batch) for n in ("x", "y"))
step.lower(params, x, y).compile()
"""
    plain = tmp_path / "plain"
    proc = subprocess.run([tpu_python, "-c", code, str(plain)], capture_output=True, text=True, timeout=120,
                          env=clean_env(LIBTPU_INIT_ARGS=BARRIER))
    assert proc.returncode == 0, proc.stderr
    assert keys_in(plain) and keys_in(plain) == keys_in(multislice["cache"])


def test_the_context_gives_the_slice_axis(tpu_python, tmp_path):
    proc = warmup("--topology", "2xv5e:2x2", "--cache-dir", str(tmp_path / "c"), "--entrypoint", "warm_targets:slices",
                  python=tpu_python)
    assert "slices 2 devices 8 slice_index [0, 1]" in proc.stdout
    assert "mesh {'data': 4, 'model': 2} slices by row [[0], [0], [1], [1]]" in proc.stdout
    assert "mesh {'data': 2, 'model': 4} slices by row [[0, 1], [0, 1]]" in proc.stdout, "dcn_shape=(1, 2)"


def test_service_filters_by_the_multislice_spelling(multislice, tmp_path):
    from fastapi.testclient import TestClient

    from jaxcache.service.app import create_app
    from jaxcache.service.settings import ServiceSettings

    app = create_app(ServiceSettings(caches={"c": str(multislice["cache"])},
                                     db=f"sqlite:///{tmp_path / 'cat.sqlite'}", insecure_no_auth=True))
    with TestClient(app) as client:
        assert client.post("/v1/caches/c/rescan").status_code == 200
        # The re-run test may have added a record of its own: every one is the two slices'.
        assert {w["topology"] for w in client.get("/v1/caches/c/warmups").json()["warmups"]} == {"2xv5e:2x2"}
        keys = {k.rsplit("-", 1)[0] for k in keys_in(multislice["cache"])}
        for spelling in ("2xv5e:2x2", "2XV5E:2x2@2x2x1"):
            got = client.get(f"/v1/caches/c/entries?topology={spelling}").json()["entries"]
            assert {e["key"] for e in got} == keys, spelling
        assert client.get("/v1/caches/c/entries?topology=v5e:2x2").json()["entries"] == []


def test_a_list_of_tpu_and_cpu_targets_gives_each_its_own_options(tpu_python, tmp_path):
    """In a list, slice names are TPU targets whatever --platform says, and only they get the TPU options."""
    cache = tmp_path / "c"
    proc = warmup("--platform", "cpu", "--topology", "1x1x2", "--topology", "v5e:1x1", "--topology", "2xv5e:2x2",
                  "--cache-dir", str(cache), "--entrypoint", EXAMPLE, f"--libtpu-init-args={BARRIER}", "--json",
                  python=tpu_python)
    out = json.loads(proc.stdout)
    assert [(t["target"], t["platform"], t["exit"]) for t in out["targets"]] == [
        ("1x1x2", "cpu", 0), ("v5e:1x1", "tpu", 0), ("2xv5e:2x2", "tpu", 0)]
    flags = {t["target"]: t["summary"]["fingerprint"]["xla_flags"] for t in out["targets"]}
    assert flags["v5e:1x1"] == flags["2xv5e:2x2"] == [BARRIER] and flags["1x1x2"] != [BARRIER]
