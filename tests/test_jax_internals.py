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


def test_the_probe_fails_loudly_when_something_is_gone(monkeypatch):
    monkeypatch.setattr(jax_internals, "ATTRIBUTES", (*jax_internals.ATTRIBUTES,
                                                      ("jax._src.compilation_cache", "_gone_since_a_release", ())))
    gone = jax_internals.LogText("Persistent compilation cache visited", "jax._src.compiler")
    monkeypatch.setattr(jax_internals, "LOG_TEXTS", (*jax_internals.LOG_TEXTS, gone))
    monkeypatch.setattr(jax_internals, "EVENTS", (*jax_internals.EVENTS, "/jax/compilation_cache/renamed"))
    monkeypatch.setattr(jax_internals, "PART_LABELS", {**jax_internals.PART_LABELS, "mesh config": "devices"})
    monkeypatch.setattr(jax_internals, "_MLIR_NAMES", (*jax_internals._MLIR_NAMES, "GoneAttr"))
    problems = jax_internals.probe()
    assert any("'mesh config'" in p for p in problems) and any("GoneAttr" in p for p in problems)
    assert any("_gone_since_a_release" in p for p in problems)
    assert any("Persistent compilation cache visited" in p for p in problems)
    assert any("/jax/compilation_cache/renamed" in p for p in problems)


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


def test_python_3_14_zstd_is_named_as_jax_hashes_it(monkeypatch, caplog):
    """On Python >= 3.14 JAX compresses with compression.zstd, leaves its zstandard attribute None and hashes
    "zlib": simulated here by setting those attributes, which is all JAX's key code looks at."""
    import platform

    from jax._src import compilation_cache as cc

    assert jax_internals.compression_library() == "zstandard"
    monkeypatch.setattr(cc, "zstandard", None)
    monkeypatch.setattr(cc, "zstd", object(), raising=False)
    monkeypatch.setattr(jax_internals, "_warned", set())
    with caplog.at_level("WARNING", logger="jaxcache.client"):
        assert jax_internals.compression_library() == "zlib"
        assert jax_internals.compression_library() == "zlib"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "compression.zstd" in warning and platform.python_version() in warning
    fingerprint = jax_internals.fingerprint("zlib")
    assert fingerprint.compression == "zlib" and fingerprint.python == platform.python_version()

    monkeypatch.setattr(cc, "zstd", None)
    with pytest.raises(Exception, match="pip install zstandard"):
        jax_internals.compression_library()
