"""`warmup --check` (a pre-flight on a target node that writes nothing) and `--verify`'s explained misses."""

from __future__ import annotations

import json
from pathlib import Path

from test_warmup import EXAMPLE, clean_env, warmup


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_check_reports_full_coverage_and_writes_nothing(tmp_path):
    cache = tmp_path / "c"
    args = ("--topology", "1x1x2", "--platform", "cpu", "--cache-dir", str(cache), "--entrypoint", EXAMPLE)
    warmup(*args)
    before = snapshot(cache)
    out = json.loads(warmup(*args, "--check", "--json").stdout)
    assert (out["hits"], out["programs"], out["coverage"], out["misses"]) == (1, 1, 1.0, [])
    assert snapshot(cache) == before, "a check writes no entry, record or -atime"


def test_check_on_a_node_with_other_flags_exits_1_naming_the_flag(tmp_path):
    cache = tmp_path / "c"
    args = ("--topology", "1x1x2", "--platform", "cpu", "--cache-dir", str(cache), "--entrypoint", EXAMPLE)
    warmup(*args)
    before = snapshot(cache)
    node = clean_env(XLA_FLAGS="--xla_cpu_enable_fast_math=true")
    out = json.loads(warmup(*args, "--check", "--json", expect=1, env=node).stdout)
    (miss,) = out["misses"]
    assert out["hits"] == 0 and miss["cause"] == "xla_flags" and miss["nearest"]
    flags = next(d for d in miss["differs"] if d["part"] == "xla_flags")
    assert flags["changes"] == ["added --xla_cpu_enable_fast_math=true"]
    text = warmup(*args, "--check", expect=1, env=node).stdout
    words = " ".join(text.split())
    assert "0 of 1 program hit" in words and "give the warm-up the job's XLA_FLAGS" in words
    # Wrapped as `jaxcache explain` prints it: a heading, each change on a line of its own, the fix under them.
    lines = text.splitlines()
    assert max(map(len, lines[1:])) <= 100, text  # the first names the cache, whatever its length
    assert "xla_flags: jit_" in text and "    - added --xla_cpu_enable_fast_math=true" in lines, text
    assert snapshot(cache) == before


def test_verify_explains_each_miss_part_by_part(tmp_path):
    proc = warmup("--topology", "1x1x1", "--platform", "cpu", "--cache-dir", str(tmp_path / "c"),
                  "--entrypoint", "warm_targets:unstable", "--verify", "--json", expect=1)
    (miss,) = json.loads(proc.stdout)["verify"]["misses"]
    # The warm-up and its verify run: the same signature and environment, another program each time.
    assert miss["cause"] == "unstable_program" and [d["part"] for d in miss["differs"]] == ["computation"]
    assert "the signature is equal" in miss["differs"][0]["changes"][0]


def test_check_for_a_job_that_verifies_signatures_names_what_it_would_compile(tmp_path):
    """With JAXCACHE_TRUSTED_KEYS, as a `verify="signed"` job has it: an entry written without a key is a miss."""
    from jaxcache import signing

    cache = tmp_path / "c"
    args = ("--topology", "1x1x2", "--platform", "cpu", "--cache-dir", str(cache), "--entrypoint", EXAMPLE)
    trusted = signing.new_key("ci", str(tmp_path / "ci.key")).public_text()
    warmup(*args)  # no signing key: the entry is stored unsigned
    node = clean_env(JAXCACHE_TRUSTED_KEYS=trusted)
    out = json.loads(warmup(*args, "--check", "--json", expect=1, env=node).stdout)
    (miss,) = out["misses"]
    assert out["hits"] == 0 and (miss["cause"], miss["why"]) == ("skipped", "unsigned"), miss
    assert "jaxcache keys sign" in warmup(*args, "--check", expect=1, env=node).stdout

    signed = tmp_path / "signed"
    warmup(*args[:-3], str(signed), *args[-2:], env=clean_env(JAXCACHE_SIGNING_KEY=str(tmp_path / "ci.key")))
    out = json.loads(warmup(*args[:-3], str(signed), *args[-2:], "--check", "--json", env=node).stdout)
    assert (out["hits"], out["misses"]) == (1, [])
