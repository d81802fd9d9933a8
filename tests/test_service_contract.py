"""The API's contract as a generated client sees it: schemathesis's CLI, every check, against `jaxcache serve` over
real HTTP with an admin token, on each catalog. Every case must pass: a request the OpenAPI document admits is
accepted, one it rejects is refused, and every answer (status, headers, body) is the one documented.

``JAXCACHE_CONTRACT_SEED`` picks another seed (default: a fixed one, so that a run is repeatable) and
``JAXCACHE_CONTRACT_EXAMPLES`` more cases per operation, to look further than CI does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from conftest import jaxcache_serve

pytest.importorskip("schemathesis")

ADMIN = "contract-admin-token"
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
SEED = int(os.environ.get("JAXCACHE_CONTRACT_SEED", "20261201"))
EXAMPLES = int(os.environ.get("JAXCACHE_CONTRACT_EXAMPLES", "50"))


#: schemathesis's phases in four runs of about the same time, each well under a minute and run side by side by
#: xdist: name -> (phases, operations, fewest cases). Together they are one run's phases, cases and checks: the
#: fuzzing phase, the longest, is split between the GET operations and the rest. Each asserts what it explored.
RUNS = {
    "examples,coverage": ("examples,coverage", (), 700),
    "stateful": ("stateful", (), 200),
    "fuzzing-get": ("fuzzing", ("--include-method", "GET"), 400),
    "fuzzing-writes": ("fuzzing", ("--exclude-method", "GET"), 250),
}


def _operations(document: dict, operations: tuple[str, ...]) -> int:
    """How many of the document's operations a run's filter (``--include-method``/``--exclude-method``) keeps."""
    methods = [method.upper() for ops in document["paths"].values() for method in ops]
    if not operations:
        return len(methods)
    flag, method = operations
    return sum((m == method) == (flag == "--include-method") for m in methods)


@pytest.mark.slow
@pytest.mark.parametrize("run_name", list(RUNS))
def test_every_generated_case_keeps_the_contract(catalog_url, cache_copy, tmp_path, run_name):
    phases, operations, fewest = RUNS[run_name]
    report = tmp_path / "schemathesis.json"
    # The cache is named as the document's examples name one, so that examples reach real data. One worker
    # process: the contract is each process's, and a second only adds its start to every run.
    with jaxcache_serve({"prod": cache_copy}, catalog_url, tokens={ADMIN: "admin"}, args=("--workers", "1")) as base:
        document = httpx.get(f"{base}/openapi.json").json()
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("st")), "run", f"{base}/openapi.json", "--checks", "all",
             "-H", f"Authorization: Bearer {ADMIN}", "--max-examples", str(EXAMPLES), "--seed", str(SEED),
             "--phases", phases, *operations, "--generation-database", "none", "--no-color", "--report", "json",
             "--report-json-path", str(report)],
            cwd=tmp_path, capture_output=True, text=True, timeout=600,
            env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS), "JAXCACHE_CONTRACT_ROOT": str(cache_copy)},
        )
    said = proc.stdout[-6000:] + proc.stderr[-2000:]
    run = json.loads(report.read_text())
    assert run["failures"] == [] and run["errors"] == [] and proc.returncode == 0, said
    # The state machine walks the document's links, so its run reaches the linked operations only.
    if phases == "stateful":
        assert run["operations"]["tested"] >= 3, said
    else:
        assert run["operations"]["tested"] == _operations(document, operations) >= 8, said
    assert run["test_cases"]["generated"] >= fewest, said  # the run explored, not only loaded the document
    ran = {name for name, phase in run["phases"].items() if phase["status"] != "skip"}
    assert ran == set(phases.split(",")), run["phases"]
    assert all(run["phases"][name]["status"] == "success" for name in ran), run["phases"]
    print(f"schemathesis {run_name}: {run['operations']['tested']} operations, {run['test_cases']['generated']} "
          f"cases, 0 failures, seed {SEED}, {run['running_time']:.0f} s")
