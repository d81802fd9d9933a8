"""The service explains every job's miss as it ingests the record: the same cause `jaxcache explain` gives from the
root's own records, on SQLite and PostgreSQL catalogs; counted once in jaxcache_misses_total; by cause in stats;
on the job's page. Real JAX jobs write the cache and its records (tests/programs/explain_job.py)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache.cli import main as cli_main
from jaxcache.service.app import create_app
from reports_support import BOTH, H_ADMIN, H_READ, counted, report, rescan, settings, write
from reports_support import run as record
from test_explain_jax import run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def jobs_root(tmp_path_factory) -> Path:
    """train wrote the program for 32 rows; then ran with 16 rows (program_changed), with other XLA flags
    (xla_flags), and with a compiler option (compile_options)."""
    root = tmp_path_factory.mktemp("explained") / "cache"
    run(root, "--rows", "32")
    run(root, "--rows", "16")
    run(root, env={"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    run(root, "--compiler-option", "xla_cpu_enable_fast_math=true")
    return root


def cli_causes(root: Path, capsys) -> dict[tuple[str, str], dict]:
    capsys.readouterr()
    assert cli_main(["explain", str(root), "--job", "train", "--json"]) == 0
    return {(m["run_id"], m["key"]): m for m in json.loads(capsys.readouterr().out)["misses"]}


def metric(client, cause: str) -> float:
    """Misses of ``cause`` counted, once they reach the one each test expects (counted after the drain commits)."""
    return counted(client, f'jaxcache_misses_total{{cache="demo",cause="{cause}"}}', 1)


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request, tmp_path, jobs_root):
    root = tmp_path / "cache"
    shutil.copytree(jobs_root, root)
    db = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    with TestClient(create_app(settings(tmp_path, {"demo": str(root)}, db=db))) as client:
        settled(client)
        rescan(client)
        yield client, root


def test_the_service_gives_each_miss_the_cause_the_cli_gives(service, capsys):
    client, root = service
    cli = cli_causes(root, capsys)
    causes = {"new_program", "program_changed", "xla_flags", "compile_options"}  # the first run's, then one per change
    assert sorted(m["cause"] for m in cli.values()) == sorted(causes), cli
    job = client.get("/v1/caches/demo/jobs/train", headers=H_READ).json()
    api = {m["key"]: m for m in job["missed"]}
    for (_, key), want in cli.items():
        got = api[key]
        assert (got["cause"], got["nearest"], got["fix"]) == (want["cause"], want["nearest"], want["fix"]), key
        assert [d["part"] for d in got["differs"]] == [d["part"] for d in want["differs"]]
    flags = next(m for m in api.values() if m["cause"] == "xla_flags")
    assert any("--xla_cpu_enable_fast_math=true" in c for d in flags["differs"] for c in d["changes"]), flags
    option = "compiler_options.xla_cpu_enable_fast_math: (default) → True"
    options = next(m for m in api.values() if m["cause"] == "compile_options")
    assert [d["changes"] for d in options["differs"]] == [[option]] and option in options["fix"], options
    page = client.get("/caches/demo/jobs/train", headers=H_READ)
    assert page.status_code == 200 and option in page.text and "bucket or pad" in page.text

    stats = client.get("/v1/caches/demo/stats", headers=H_READ).json()["misses_by_cause"]
    day = {c["cause"]: c for c in stats["last_24h"]["causes"]}
    assert set(day) == causes and stats["last_24h"]["unexplained"] == 0
    assert all(c["misses"] == 1 and c["compile_s"] > 0 for c in day.values()), day

    # Counted once: a rescan that finds the same records, or a changed record file, explains nothing new.
    assert [metric(client, c) for c in sorted(causes)] == [1.0] * len(causes)
    for path in (root / ".jaxcache").rglob("*.json"):
        path.touch()
    rescan(client)
    assert [metric(client, c) for c in sorted(causes)] == [1.0] * len(causes)


def test_a_second_shape_in_a_first_run_is_a_changed_program(tmp_path):
    """A cache only one run wrote: the entry of its first shape is the run's own, not plain JAX's."""
    root = tmp_path / "cache"
    run(root, "--job", "shapes", "--rows", "32", "--then-rows", "16")
    with TestClient(create_app(settings(tmp_path, {"demo": str(root)}))) as client:
        settled(client)
        rescan(client)
        missed = client.get("/v1/caches/demo/jobs/shapes", headers=H_READ).json()["missed"]
    assert sorted(m["cause"] for m in missed) == ["new_program", "program_changed"], missed
    changed = next(m for m in missed if m["cause"] == "program_changed")
    assert any("argument 0: f32[32,16] → f32[16,16]" in c for d in changed["differs"] for c in d["changes"])


def test_a_pruned_entry_is_an_eviction_that_names_the_prune(service):
    client, root = service
    r = client.post("/v1/caches/demo/prune", headers=H_ADMIN,
                    json={"functions": ["jit_*"], "min_age": "0s", "dry_run": False})
    assert r.status_code == 200 and r.json()["deleted"], r.text
    run(root, "--rows", "32")
    rescan(client)
    job = client.get("/v1/caches/demo/jobs/train", headers=H_READ).json()
    evicted = [m for m in job["missed"] if m["cause"] == "evicted"]
    assert len(evicted) == 1 and "prune #" in evicted[0]["fix"], job["missed"]
    assert metric(client, "evicted") == 1.0
    page = client.get("/caches/demo/jobs/train", headers=H_READ)
    assert page.status_code == 200 and "evicted" in page.text and "prune #" in page.text


@BOTH
def test_records_without_key_parts_still_ingest_and_say_unknown(svc):
    """Records of a client from before key parts: the miss of a function seen before under another key has nothing
    to compare, and says so; the first sight of a function is still new_program."""
    now = time.time()
    first, second = "jit_old-" + "a" * 64, "jit_old-" + "b" * 64
    report(svc, record("legacy", "l1", [write(first, 3.0, now - 600)], at=now - 500))
    report(svc, record("legacy", "l2", [write(second, 4.0, now - 100)], at=now - 50))
    missed = {m["key"]: m for m in svc.get("/v1/caches/demo/jobs/legacy", headers=H_READ).json()["missed"]}
    assert missed[first]["cause"] == "new_program"
    assert missed[second]["cause"] == "unknown" and "jaxcache.client" in missed[second]["fix"], missed[second]


def test_misses_of_the_same_keys_are_explained_in_few_batches():
    """Jobs miss the same keys: one history read serves many runs' misses, bounded by keys and by misses."""
    from jaxcache.service.reports.ingest.misses import BATCH, BATCH_KEYS, Pending, batches

    storm = [Pending(f"run-{p}", "train", f"key-{k}") for p in range(1000) for k in range(60)]
    got = list(batches(storm))
    assert [len(b) for b in got] == [BATCH, BATCH, len(storm) - 2 * BATCH]
    assert [p for b in got for p in b] == storm  # in order, each once
    distinct = [Pending("run", "train", f"key-{k}") for k in range(BATCH_KEYS + 5)]
    assert [len(b) for b in batches(distinct)] == [BATCH_KEYS, 5]
    assert list(batches([])) == []
