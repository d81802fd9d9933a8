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

import pytest

from conftest import jaxcache_serve

pytest.importorskip("schemathesis")

ADMIN = "contract-admin-token"
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
SEED = int(os.environ.get("JAXCACHE_CONTRACT_SEED", "20261201"))
EXAMPLES = int(os.environ.get("JAXCACHE_CONTRACT_EXAMPLES", "50"))


#: schemathesis's phases, in two runs of about the same time: each test stays well under a minute, and xdist runs
#: them side by side. Together they are one run's phases, cases and checks; each asserts what it explored.
PHASES = {"examples,coverage,stateful": 1500, "fuzzing": 800}


@pytest.mark.slow
@pytest.mark.parametrize("phases", list(PHASES))
def test_every_generated_case_keeps_the_contract(catalog_url, cache_copy, tmp_path, phases):
    report = tmp_path / "schemathesis.json"
    # The cache is named as the document's examples name one, so that examples reach real data.
    with jaxcache_serve({"prod": cache_copy}, catalog_url, tokens={ADMIN: "admin"}) as base:
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("st")), "run", f"{base}/openapi.json", "--checks", "all",
             "-H", f"Authorization: Bearer {ADMIN}", "--max-examples", str(EXAMPLES), "--seed", str(SEED),
             "--phases", phases, "--generation-database", "none", "--no-color", "--report", "json",
             "--report-json-path", str(report)],
            cwd=tmp_path, capture_output=True, text=True, timeout=600,
            env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS), "JAXCACHE_CONTRACT_ROOT": str(cache_copy)},
        )
    said = proc.stdout[-6000:] + proc.stderr[-2000:]
    run = json.loads(report.read_text())
    assert run["failures"] == [] and run["errors"] == [] and proc.returncode == 0, said
    assert run["operations"]["tested"] == run["operations"]["total"] >= 22, said
    assert run["test_cases"]["generated"] >= PHASES[phases], said  # the run explored, not only loaded the document
    ran = {name for name, phase in run["phases"].items() if phase["status"] != "skip"}
    assert ran == set(phases.split(",")), run["phases"]
    assert all(run["phases"][name]["status"] == "success" for name in ran), run["phases"]
    print(f"schemathesis {phases}: {run['test_cases']['generated']} cases, 0 failures, seed {SEED}, "
          f"{run['running_time']:.0f} s")
