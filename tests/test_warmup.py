"""`warmup`: CPU path end to end (local and each object store), every bad input, and the GPU path's logic with fake
devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxcache import coverage, keyparts, records, working_set_index
from jaxcache.errors import InvalidInputError
from jaxcache.storage import LocalStorage
from jaxcache.topology import Topology
from jaxcache.warmup import devices as dev
from jaxcache.working_set import Wanted

PROGRAMS = Path(__file__).parent / "programs"
EXAMPLE = "jaxcache.warmup.examples:warm"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_COMPILATION_CACHE"))}
    env.update(extra)
    return env


def warmup(*args: str, expect: int | None = 0, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "jaxcache.warmup", *args], capture_output=True, text=True,
                          timeout=600, cwd=PROGRAMS, env=env or clean_env())
    if expect is not None:
        assert proc.returncode == expect, f"exit {proc.returncode}, expected {expect}\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_example_job(cache: str, devices: int = 4) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "jaxcache.warmup.examples", "--devices", str(devices)],
                          capture_output=True, text=True, timeout=600,
                          env=clean_env(JAXCACHE_DIR=cache, JAXCACHE_JOB="example-job", JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def service_view(cache: Path, tmp_path: Path) -> dict:
    """What the catalog service says about the cache's warm-ups after a rescan."""
    from fastapi.testclient import TestClient

    from jaxcache.service.app import create_app
    from jaxcache.service.settings import ServiceSettings

    app = create_app(ServiceSettings(caches={"c": str(cache)}, db=f"sqlite:///{tmp_path / 'catalog.sqlite'}",
                                     insecure_no_auth=True))
    with TestClient(app) as client:
        assert client.post("/v1/caches/c/rescan").status_code == 200
        listed = client.get("/v1/caches/c/warmups").json()
        detail = client.get(f"/v1/caches/c/warmups/{listed['warmups'][0]['id']}").json()
        assert client.get("/v1/caches/c/warmups/nope").status_code == 404
    return {**listed, "detail": detail}


def test_cpu_warmup_fills_a_local_cache_that_a_fresh_job_hits_completely(tmp_path):
    cache = tmp_path / "cache"
    proc = warmup("--topology", "1x1x4", "--platform", "cpu", "--cache-dir", str(cache), "--entrypoint", EXAMPLE,
                  "--job", "nightly", "--verify", "--json")
    summary = json.loads(proc.stdout)
    assert summary["topology"] == "1x1x4" and summary["platform"] == "cpu" and summary["job"] == "nightly"
    assert summary["programs"] >= 1 and summary["written"] == summary["programs"]
    assert summary["verify"]["ok"] and summary["verify"]["hits"] == summary["programs"]
    assert "jit_step" in proc.stderr and "written" in proc.stderr, "each program is shown as it finishes"

    record = coverage.parse((cache / summary["coverage_record"]).read_bytes())
    assert record.topology == "1x1x4" and record.fingerprint.local_device_count == 4
    for program in record.programs:
        assert program.status == coverage.WRITTEN and (cache / f"{program.key}-cache").is_file()
        assert program.compile_s and program.compile_s > 0
        assert program.parts is not None and program.parts.known() == list(keyparts.ORDER)
        assert program.program is not None and program.program.args, program

    job = run_example_job(str(cache))
    assert "1 hit, 0 misses" in job.stderr and "hit rate 100%" in job.stderr, job.stderr  # the exit summary
    runs = [records.parse(p.read_bytes()) for p in cache.glob(".jaxcache/runs/*/*.json")]
    job_run = next(r for r in runs if r.job == "example-job")
    assert {u.key for u in job_run.keys} == {p.key for p in record.programs}
    assert all(u.event == records.HIT for u in job_run.keys)
    assert {u.key: u.parts for u in job_run.keys} == {p.key: p.parts for p in record.programs}

    # The service lists the warm-up and how much of it the job has used since.
    listed = service_view(cache, tmp_path)
    (w,) = listed["warmups"]
    assert (w["id"], w["topology"], w["programs"], w["written"]) == (record.id, "1x1x4", len(record.programs),
                                                                     len(record.programs))
    assert w["hit_since"] == len(record.programs)
    assert {k["key"] for k in listed["detail"]["keys"] if k["hit_since"]} == {p.key for p in record.programs}

    # A re-run on the warm cache is a success: the cache holds every program (a scheduled re-run, a Job's retry).
    again = warmup("--topology", "1x1x4", "--platform", "cpu", "--cache-dir", str(cache), "--entrypoint", EXAMPLE)
    n = len(record.programs)
    assert f"already warm: {'the 1 program was' if n == 1 else f'all {n} programs were'} in the cache" in again.stdout
    assert "error" not in again.stderr and "failed" not in again.stdout + again.stderr, again.stderr
    # --ok-if-warm, which scripts and Jobs pass, is still taken (it does nothing now), and says so in --help.
    warmup("--topology", "1x1x4", "--platform", "cpu", "--cache-dir", str(cache), "--entrypoint", EXAMPLE,
           "--ok-if-warm")
    assert "deprecated, does nothing" in " ".join(warmup("--help").stdout.split())


def test_cpu_warmup_into_an_object_store_then_a_check_and_a_job_hit(store_root):
    from jaxcache.storage import open_storage

    url = store_root
    args = ("--topology", "1x1x4", "--platform", "cpu", "--cache-dir", url, "--entrypoint", EXAMPLE)
    proc = warmup(*args, "--verify", "--json")
    summary = json.loads(proc.stdout)
    assert summary["verify"]["ok"] and summary["written"] >= 1
    assert coverage.parse(open_storage(url).read(summary["coverage_record"])).cache_dir == url
    check = json.loads(warmup(*args, "--check", "--json").stdout)
    assert check["coverage"] == 1.0 and check["misses"] == [], check
    job = run_example_job(url)
    assert "hit rate 100%" in job.stderr


def test_script_mode_passes_its_arguments(tmp_path):
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(tmp_path / "c"),
                  "--script", "warm_script.py", "--json", "--", "--width", "16")
    summary = json.loads(proc.stdout)
    assert summary["written"] >= 1
    assert any(k["function"].startswith("jit__lambda") for k in summary["keys"])


def test_a_script_that_enables_the_cache_itself_runs_under_the_warmups_settings(tmp_path):
    cache = tmp_path / "c"
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(cache), "--script",
                  "train_script.py", "--verify")
    assert f"script got job=warmup cache={cache}" in proc.stdout
    assert "verify: ok" in proc.stdout
    (notice,) = [line for line in proc.stderr.splitlines() if "runs this script under its own cache settings" in line]
    assert "job='train'" in notice and "min_compile_time_secs=5" in notice and "cache_dir='./somewhere'" in notice
    assert not (PROGRAMS / "somewhere").exists(), "the script's own directory is not used"
    (coverage_file,) = cache.glob(".jaxcache/warmups/*.json")
    record = coverage.parse(coverage_file.read_bytes())
    assert record.programs and all(p.status == coverage.WRITTEN for p in record.programs)
    assert all((cache / f"{p.key}-cache").is_file() for p in record.programs)
    # In the job's working-set index too, which its starts read in one request (the warm-up's own runs add nothing).
    found = working_set_index.from_index(LocalStorage(str(cache)), "warmup", Wanted())
    assert found is not None and found.warmups == [record.id] and found.runs == []
    assert found.keys == [p.key for p in record.programs]


def test_a_verify_process_past_its_timeout_fails_without_a_traceback(tmp_path):
    env = clean_env(WARM_TARGETS_MARKER=str(tmp_path / "ran-once"))
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(tmp_path / "c"),
                  "--entrypoint", "warm_targets:slow_to_verify", "--verify", "--verify-timeout", "5", expect=1,
                  env=env)
    assert "verify: FAILED: the verify process did not finish in 5 s" in proc.stdout, proc.stdout
    assert "--verify-timeout" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(tmp_path / "c"),
                  "--entrypoint", EXAMPLE, "--verify-timeout", "0", expect=2)
    assert "--verify-timeout" in proc.stderr and "positive number of seconds" in proc.stderr


def test_a_warmup_and_its_verify_run_are_not_jobs(tmp_path):
    cache = tmp_path / "cache"
    summary = json.loads(warmup("--topology", "1x1x2", "--platform", "cpu", "--cache-dir", str(cache),
                                "--entrypoint", EXAMPLE, "--verify", "--json").stdout)
    assert summary["verify"]["ok"]
    runs = [records.parse(p.read_bytes()) for p in cache.glob(".jaxcache/runs/*/*.json")]
    assert sorted(r.kind for r in runs) == ["warmup", "warmup-verify"]

    before = catalog_view(cache, tmp_path)
    assert before["warmups"][0]["hit_since"] == 0, "its own verify run is not a job hitting it"
    assert before["jobs"] == []
    assert (before["last_24h"]["hits"], before["last_24h"]["misses"], before["last_24h"]["hit_rate"]) == (0, 0, None)

    run_example_job(str(cache), devices=2)
    after = catalog_view(cache, tmp_path)
    assert after["warmups"][0]["hit_since"] == summary["programs"]
    assert [j["job"] for j in after["jobs"]] == ["example-job"]
    window = after["last_24h"]
    assert (window["jobs"], window["misses"], window["hit_rate"]) == (1, 0, 1.0)
    assert window["hits"] == summary["programs"]


def catalog_view(cache: Path, tmp_path: Path) -> dict:
    """Warm-ups, jobs and the last day's hit rate, as the service sees them after a rescan."""
    from fastapi.testclient import TestClient

    from jaxcache.service.app import create_app
    from jaxcache.service.settings import ServiceSettings

    app = create_app(ServiceSettings(caches={"c": str(cache)}, db=f"sqlite:///{tmp_path / 'view.sqlite'}",
                                     insecure_no_auth=True))
    with TestClient(app) as client:
        assert client.post("/v1/caches/c/rescan").status_code == 200
        return {"warmups": client.get("/v1/caches/c/warmups").json()["warmups"],
                "jobs": client.get("/v1/caches/c/jobs").json()["jobs"],
                "last_24h": client.get("/v1/caches/c/stats").json()["last_24h"]}


def test_verify_reports_misses_with_both_fingerprints(tmp_path):
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(tmp_path / "c"),
                  "--entrypoint", "warm_targets:unstable", "--verify", expect=1)
    assert "missed in a fresh process" in proc.stdout
    assert "fingerprint" in proc.stdout and "warm-up" in proc.stdout and "verify run" in proc.stdout


def test_dry_run_checks_everything_and_writes_nothing(tmp_path):
    cache = tmp_path / "c"
    proc = warmup("--topology", "1x1x2", "--platform", "cpu", "--cache-dir", str(cache), "--entrypoint", EXAMPLE,
                  "--dry-run", "--json")
    plan = json.loads(proc.stdout)
    assert plan["dry_run"] and plan["jax_settings"] == {"jax_platforms": "cpu", "jax_num_cpu_devices": 2}
    assert not cache.exists()


BAD_TOPOLOGIES = ["4x8", "0x1x1", "-1x2x1", "axbxc", "4x8x1x2", "100000x1x1", "1x1x100000", ""]


@pytest.mark.parametrize("topology", BAD_TOPOLOGIES)
def test_malformed_topology_exit_2_one_line_nothing_written(tmp_path, topology):
    cache = tmp_path / "c"
    proc = warmup(f"--topology={topology}", "--platform", "cpu", "--cache-dir", str(cache), "--entrypoint",
                  EXAMPLE, expect=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warmup: error: topology"), proc.stderr
    assert not cache.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--platform", "cpu", "--topology", "2x1x4"], "multi-process CPU job never hits"),
        (["--platform", "gpu", "--topology", "1x1x1"], "needs 1 GPU(s) of the target nodes' model"),
        (["--platform", "cpu", "--topology", "1x1x1", "--script", "warm_script.py"], "not both"),
        (["--platform", "cpu", "--topology", "1x1x1", "--entrypoint", "no_colon"], "pkg.module:function"),
        (["--platform", "cpu", "--topology", "1x1x1", "--entrypoint", "warm_targets:missing"], "no function"),
    ],
)
def test_bad_input_exit_2_with_a_clear_line(tmp_path, args, message):
    cache = tmp_path / "c"
    argv = ["--cache-dir", str(cache), *args]
    if "--entrypoint" not in args:
        argv += ["--entrypoint", EXAMPLE]
    proc = warmup(*argv, expect=2)
    assert message in proc.stderr and proc.stderr.startswith("warmup: error:"), proc.stderr
    assert not cache.exists()


# `warmup` run as its console script does, saying on stdout, last, whether JAX was imported.
NO_JAX = """
import atexit, sys
atexit.register(lambda: print("imported jax" if "jax" in sys.modules else "no jax"))
sys.argv[0] = "warmup"
from jaxcache.warmup.cli import run
run()
"""


@pytest.mark.parametrize(("args", "said"), [
    (["--topology", "1x1x2", "--verify-timeout", "abc"], "argument --verify-timeout: 'abc': use a positive number"),
    (["--topology", "1x1x2", "--verify-timeout", "-5"], "argument --verify-timeout: '-5': use a positive number"),
    (["--topology", "1x1x2", "--topology", "1x1x4", "--parallel", "0"], "argument --parallel: '0': use a whole"
                                                                         " number, 1 or more"),
    (["--topology", "v5e:2x2", "--num-slices", "x"], "argument --num-slices: 'x': use a whole number, 1 or more"),
    (["--topology", "1x1x2", "--index", "-1"], "argument --index: '-1': use a whole number, 0 or more"),
    (["--topology", "1x1x2", "--platform", "xpu"], "argument --platform: invalid choice: 'xpu'"),
    (["--topology", "1x1x2", "--trust", "maybe"], "argument --trust: invalid choice: 'maybe'"),
    (["--topology"], "argument --topology: expected one argument"),
    (["--topology", "v5e:2x2", "--libtpu-init-args", "--xla_tpu_x=1"],
     "argument --libtpu-init-args: expected one argument (flags, written with '=': --libtpu-init-args='--xla_"),
    (["--topology", "1x2"], "topology '1x2' has 2 part(s), not 3"),
    (["--topology", "v5e:3x3"], "topology 'v5e:3x3': v5e makes no 3x3 slice"),
    (["--topology", "1x1x2", "--topology", "1x2"], "topology '1x2' has 2 part(s), not 3"),
    (["--topology", "1x1x2", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--entrypoint", EXAMPLE], "give the target: --topology"),
    (["--topology", "1x1x2", "--entrypoint", "nocolon"], "--entrypoint 'nocolon': write it as pkg.module:function"),
    (["--topology", "1x1x2", "--entrypoint", "no_such_module.jobs:warm"],
     "--entrypoint 'no_such_module.jobs:warm': no module 'no_such_module' here"),
    (["--topology", "v5e:2x2", "--checked-flags", "{}"], "--checked-flags: not the target's flags"),
])
def test_bad_input_is_one_line_naming_it_before_jax_loads(tmp_path, args, said):
    """The user guide's promise (#60): one line on stderr naming the option and what it takes, exit 2, nothing
    written; and refused before JAX loads (seconds a typo should not wait for)."""
    cache = tmp_path / "c"
    if "--entrypoint" not in args:
        args = [*args, "--entrypoint", EXAMPLE]
    proc = subprocess.run([sys.executable, "-c", NO_JAX, *args, "--cache-dir", str(cache)], capture_output=True,
                          text=True, timeout=60, cwd=PROGRAMS, env=clean_env())
    assert proc.returncode == 2 and proc.stdout == "no jax\n", (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"warmup: error: {said}") and proc.stderr.count("\n") == 1, proc.stderr
    assert not cache.exists()


def test_a_gpu_style_target_on_a_machine_without_gpus_says_it_compiles_for_the_cpu(tmp_path):
    """No --platform and no GPU here: the documented default is the CPU, said in one warning line before anything
    compiles, once a command (naming each target concerned); not when --platform cpu says it is meant."""
    def warnings_of(proc: subprocess.CompletedProcess) -> list[str]:
        return [line for line in proc.stderr.splitlines() if line.startswith("warmup: warning:")]

    args = ("--cache-dir", str(tmp_path / "c"), "--entrypoint", EXAMPLE, "--dry-run", "--json")
    proc = warmup("--topology", "1x1x2", *args)
    assert json.loads(proc.stdout)["platform"] == "cpu"
    assert warnings_of(proc) == ["warmup: warning: no GPU here: compiling 1x1x2 for the CPU, which GPU jobs never hit;"
                                 " pass --platform cpu to say that is meant, or run on a node with the target's GPUs"]
    assert warnings_of(warmup("--topology", "1x1x2", "--platform", "cpu", *args)) == []

    proc = warmup("--topology", "1x1x2", "--topology", "1x1x4", *args)
    (line,) = warnings_of(proc)
    assert line.startswith("warmup: warning: no GPU here: compiling 1x1x2, 1x1x4 for the CPU"), proc.stderr
    out = json.loads(proc.stdout)
    assert [(t["target"], t["platform"], t["errors"]) for t in out["targets"]] == [("1x1x2", "cpu", []),
                                                                                    ("1x1x4", "cpu", [])]


def test_neither_entrypoint_nor_script(tmp_path):
    proc = warmup("--topology", "1x1x1", "--cache-dir", str(tmp_path / "c"), expect=2)
    assert "exactly one of --entrypoint" in proc.stderr


def test_untrusted_cache_dir_is_bad_input(tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(cache), "--entrypoint", EXAMPLE,
                  "--dry-run", expect=2)
    assert "not trustworthy" in proc.stderr


def test_user_code_failures_exit_1_with_their_traceback_marked(tmp_path):
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(tmp_path / "c"),
                  "--entrypoint", "warm_targets:broken", expect=1)
    assert "traceback from YOUR code" in proc.stderr and "the user's own bug" in proc.stderr
    assert "warm_targets.py" in proc.stderr and "warmup/target.py" not in proc.stderr
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(tmp_path / "c"),
                  "--entrypoint", "warm_targets.nope:warm", expect=1)
    assert "failed to import" in proc.stderr and "No module named 'warm_targets.nope'" in proc.stderr


def test_nothing_compiled_exit_1_says_why(tmp_path):
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(tmp_path / "a"),
                  "--entrypoint", "warm_targets:nothing", expect=1)
    assert "no jit calls" in proc.stderr
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(tmp_path / "b"),
                  "--entrypoint", "warm_targets:callbacks", expect=None)
    jax_next = proc.returncode == 0  # jax >= 0.12 caches programs with host callbacks
    if not jax_next:
        assert proc.returncode == 1 and "thresholds" in proc.stderr and "host callbacks" in proc.stderr


def test_jaxcache_warmup_is_the_same_command():
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "warmup", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "SLICESxHOSTSxDEVICES" in proc.stdout


# --- the GPU path's logic, with fake device lists ------------------------------------------------------------


def test_gpu_plan_checks_count_and_model():
    h200 = "NVIDIA H200"
    plan = dev.plan_backend(Topology(4, 8, 1), "gpu", dev.LocalGpus((h200,)))
    assert plan.gpu_model == h200
    assert plan.jax_settings() == {"jax_platforms": "cuda", "jax_mock_gpu_topology": "4x8x1"}
    with pytest.raises(dev.WarmupSetupError, match=r"needs D = 2 GPU\(s\) per process, but this machine has 1"):
        dev.plan_backend(Topology(4, 8, 2), "gpu", dev.LocalGpus((h200,)))
    with pytest.raises(dev.WarmupSetupError, match="mixes GPU models"):
        dev.plan_backend(Topology(1, 1, 2), "gpu", dev.LocalGpus((h200, "NVIDIA H100")))
    with pytest.raises(dev.WarmupSetupError, match="JAX sees none"):
        dev.plan_backend(Topology(1, 1, 1), "gpu", dev.LocalGpus(error="no CUDA"))
    with pytest.raises(InvalidInputError):
        dev.plan_backend(Topology(1, 1, 1), "tpu", None)
    assert dev.default_platform(dev.LocalGpus((h200,))) == "gpu"
    assert dev.default_platform(dev.LocalGpus(error="none")) == "cpu"


def test_mock_flag_is_set_once_before_the_backend_starts():
    code = """
import jax
from jaxcache.client.jax_internals import backend_ready
from jaxcache.topology import Topology
from jaxcache.warmup import devices as dev

plan = dev.plan_backend(Topology(1, 2, 1), "gpu", dev.LocalGpus(("NVIDIA H200",)))
dev.configure_backend(plan)
from jax._src import xla_bridge
assert xla_bridge.MOCK_GPU_TOPOLOGY.value == "1x2x1", xla_bridge.MOCK_GPU_TOPOLOGY.value
assert not backend_ready(), "configuring must not start the backend"
jax.config.update("jax_platforms", "cpu")
jax.devices()  # the backend starts: the mock can no longer be applied, so configuring again must refuse
try:
    dev.configure_backend(plan)
except dev.WarmupSetupError as exc:
    print("refused:", exc)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "refused: JAX's backend started before the warm-up configured it" in proc.stdout
