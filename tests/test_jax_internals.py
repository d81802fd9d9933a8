"""What jaxcache reads of JAX's internals is still there, on every supported JAX; and when it is not, a job says so
once, at WARNING, instead of silently recording nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxcache.client import jax_internals
from jaxcache.client.jax_internals import reads as jax_reads

PROBE = "import json; from jaxcache.client import jax_internals; print(json.dumps(jax_internals.probe()))"


@pytest.fixture(params=["jax-main", "jax-next"])
def interpreter(request) -> tuple[str, dict[str, str]]:
    if request.param == "jax-main":
        return sys.executable, {}
    return request.getfixturevalue("next_python_with_jaxcache")


def test_every_internal_jaxcache_reads_is_there(interpreter):
    python, extra = interpreter
    proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **extra})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], f"JAX moved what jaxcache reads:\n{proc.stdout}"


def test_the_probe_fails_loudly_when_something_is_gone():
    ji = jax_internals
    gone = ji.LogText("Persistent compilation cache visited", "jax._src.compiler")
    problems = ji.probe(
        attributes=(*ji.ATTRIBUTES, ("jax._src.compilation_cache", "_gone_since_a_release", ())),
        log_texts=(*ji.LOG_TEXTS, gone), events=(*ji.EVENTS, "/jax/compilation_cache/renamed"),
        part_labels=(*ji.PART_LABELS, "mesh config"), mlir_names=(*ji.MLIR_NAMES, "GoneAttr"))
    assert any("'mesh config'" in p for p in problems) and any("GoneAttr" in p for p in problems)
    assert any("_gone_since_a_release" in p for p in problems)
    assert any("Persistent compilation cache visited" in p for p in problems)
    assert any("/jax/compilation_cache/renamed" in p for p in problems)


def test_the_probe_fails_loudly_when_the_read_path_moves():
    moved = (("jax._src.compiler", "_cache_read", ("get_executable_and_time", "read_entry_bytes")),
             ("jax._src.compilation_cache", "get_executable_and_time_v2", ("get",)))
    problems = jax_reads.problems(moved)
    assert any("_cache_read no longer calls read_entry_bytes" in p for p in problems), problems
    assert any("has no get_executable_and_time_v2" in p for p in problems), problems
    assert all("verify=" in p for p in problems)


# A job on a JAX whose hit and miss records jaxcache no longer recognises: simulated by changing the texts it
# looks for, in a fresh process (enable_cache is once per process).
_JOB = textwrap.dedent("""
    import json, logging, os, sys
    MOVED = sys.argv[2] == "moved"
    os.environ["JAX_PLATFORMS"] = "cpu"
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    from jaxcache.client import enable_cache, jax_internals as ji
    for name in ("HIT", "MISS", "WRITE", "TOOK", "FAST", "CALLBACK", "NOT_P0", "SMALL", "DISABLED"):
        if MOVED:
            setattr(ji, name + "_MSG", ji.LogText("no JAX logs this", getattr(ji, name + "_MSG").logger))
    import jax, jax.numpy as jnp
    session = enable_cache(sys.argv[1], min_compile_time_secs=0, min_entry_size_bytes=-1, trust="off")
    jax.jit(lambda x: x * 3)(jnp.arange(4.0)).block_until_ready()
    jax.jit(lambda x: x - 1)(jnp.arange(4.0)).block_until_ready()
    s = session.stats()
    print(json.dumps({"unrecognised": s.unrecognised, "keys": len(session.record().keys), "jax": jax.__version__}))
""")


def test_a_job_whose_jax_logs_nothing_it_reads_warns_once_naming_the_version(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _JOB, str(tmp_path / "cache"), "moved"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["unrecognised"] >= 2 and out["keys"] == 0
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING jaxcache.client")]
    assert len(warnings) == 1, proc.stderr
    assert f"JAX {out['jax']}" in warnings[0] and "could not tell which program" in warnings[0]


def test_a_job_on_a_supported_jax_captures_every_lookup(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _JOB, str(tmp_path / "cache"), "as-is"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["unrecognised"] == 0 and out["keys"] >= 2
    assert "WARNING jaxcache.client" not in proc.stderr, proc.stderr


_WARMUP = textwrap.dedent("""
    import sys
    MOVED = True
    from jaxcache.client import jax_internals as ji
    for name in ("HIT", "MISS", "WRITE", "TOOK", "FAST", "CALLBACK", "NOT_P0", "SMALL", "DISABLED"):
        if MOVED:
            setattr(ji, name + "_MSG", ji.LogText("no JAX logs this", getattr(ji, name + "_MSG").logger))
    from jaxcache.warmup.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_warm_up_that_captures_no_keys_says_why_not_no_jit_calls(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _WARMUP, "--topology", "1x1x1", "--platform", "cpu", "--cache-dir",
                           str(tmp_path / "cache"), "--entrypoint", "jaxcache.warmup.examples:warm"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "no jit calls" not in proc.stderr
    assert "jaxcache could not tell which" in proc.stderr and "docs/jax-internals.md" in proc.stderr


def test_the_lowest_jax_the_client_claims_is_the_one_the_suite_runs_on():
    import re
    from pathlib import Path

    import jax

    root = Path(__file__).resolve().parent.parent
    floor = re.search(r'"jax>=([0-9.]+)"', (root / "client" / "pyproject.toml").read_text()).group(1)
    pinned = re.search(r"^FLOOR_JAX \?= ([0-9.]+)$", (root / "Makefile").read_text(), re.M).group(1)
    assert pinned == floor, f"make test pins jax {pinned}, but client/pyproject.toml claims jax>={floor}"
    if jax.__version__ != floor:
        pytest.skip(f"this venv has jax {jax.__version__}, not the floor {floor} that `make test` pins in .venv")
    assert jax_internals.jax_version() == tuple(int(p) for p in floor.split("."))


# JAX's compilation_cache as it imports on Python >= 3.14 (compression.zstd there: JAX compresses with it and leaves
# its zstandard attribute None, so it hashes "zlib"), or where it can import no zstd at all: the environment made in a
# fresh process before JAX is imported, which is all JAX's key code looks at. jaxcache imports zstandard afterwards.
_ZSTD = textwrap.dedent("""
    import json, logging, platform, sys, types
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    if sys.argv[1] == "stdlib-zstd":
        package, module = types.ModuleType("compression"), types.ModuleType("compression.zstd")
        package.zstd = module
        sys.modules.update({"compression": package, "compression.zstd": module})
    else:
        sys.modules.update({"compression": None, "zstandard": None})  # neither imports
    import jax._src.compilation_cache
    for name in ("compression", "zstandard"):
        if sys.modules.get(name, 0) is None:
            del sys.modules[name]
    from jaxcache.client import jax_internals
    try:
        names = [jax_internals.compression_library() for _ in range(2)]
    except Exception as exc:
        print(json.dumps({"error": str(exc)}))
    else:
        fingerprint = jax_internals.fingerprint(names[0])
        print(json.dumps({"names": names, "compression": fingerprint.compression, "python": fingerprint.python,
                          "this_python": platform.python_version()}))
""")


def _zstd_process(mode: str) -> tuple[dict, list[str]]:
    proc = subprocess.run([sys.executable, "-c", _ZSTD, mode], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING jaxcache.client")]
    return json.loads(proc.stdout.strip().splitlines()[-1]), warnings


def test_python_3_14_zstd_is_named_as_jax_hashes_it():
    assert jax_internals.compression_library() == "zstandard"
    out, warnings = _zstd_process("stdlib-zstd")
    assert out["names"] == ["zlib", "zlib"]
    (warning,) = warnings  # once
    assert "compression.zstd" in warning and out["this_python"] in warning
    assert out["compression"] == "zlib" and out["python"] == out["this_python"]

    out, _ = _zstd_process("no-zstd")
    assert "pip install zstandard" in out["error"]
