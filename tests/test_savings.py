"""Seconds saved that tell the truth (#73 item 7), and the summary a plain script sees (part of item 8).

A warm-up writes a job's program; the job's hits are credited with the warm-up's time on its machine, said so, until
a run of the job compiles the program itself, on its own platform: then with that measure, in the job's exit line,
the API and the dashboard alike. An entry no record measured is credited with the whole seconds JAX stored. One name
per figure: the user guide's table, held against every surface."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zstandard
from fastapi.testclient import TestClient

from dashboard_support import ROOT
from jaxcache import records
from jaxcache.client import exit_summary
from jaxcache.errors import InvalidInputError
from jaxcache.service.app import create_app
from jaxcache.service.settings import ServiceSettings

EXAMPLE = "jaxcache.warmup.examples:warm"
JOB = "j"
CPUS = len(os.sched_getaffinity(0))
MACHINE = f"cpu, {CPUS} core{'s' if CPUS != 1 else ''}"
#: A job's exit line: its seconds saved, and what they are credited with.
SAVED = re.compile(r", ([0-9.]+) s saved(?: \((.*?)\))?; cache ")

SQUARE_JOB = """
import jax, jax.numpy as jnp
from jaxcache.client import enable_cache
enable_cache()
def square(x):
    for _ in range(8):
        x = jnp.tanh(x @ x)
    return x
jax.jit(square)(jnp.full((64, 64), 0.01)).block_until_ready()
"""


def env_of(root: Path | str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_", "XLA_"))}
    return env | {"JAX_PLATFORMS": "cpu", "JAXCACHE_DIR": str(root), "JAXCACHE_JOB": JOB,
                  "JAXCACHE_MIN_COMPILE_TIME_S": "0"} | extra


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def exit_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The job's one summary line, on stderr, with nothing configured."""
    said = [line for line in proc.stderr.splitlines() if line.startswith(f"jaxcache: job {JOB}: ")]
    assert len(said) == 1, proc.stderr
    return said[0]


def saved_of(line: str) -> tuple[float, str | None]:
    found = SAVED.search(line)
    assert found is not None, line
    return float(found.group(1)), found.group(2)


def run_records(root: Path) -> list[records.RunRecord]:
    found = [records.parse(p.read_bytes()) for p in root.glob(".jaxcache/runs/*/*.json")]
    return sorted((r for r in found if r.kind == records.JOB), key=lambda r: r.started_at)


def seen_by_service(root: Path, db: Path, key: str) -> dict[str, Any]:
    """The API's and the dashboard's figures after a rescan (one catalog across calls, as a service keeps it)."""
    app = create_app(ServiceSettings(caches={"c": str(root)}, db=f"sqlite:///{db}", insecure_no_auth=True))
    with TestClient(app) as client:
        assert client.post("/v1/caches/c/rescan").status_code == 200
        return {"job": client.get(f"/v1/caches/c/jobs/{JOB}").json(),
                "entry": client.get(f"/v1/caches/c/entries/{key}").json(),
                "openapi": client.get("/openapi.json").json(),
                "pages": {path: client.get(path).text for path in (
                    "/caches/c", "/caches/c/entries", f"/caches/c/entries/{key}", "/caches/c/jobs",
                    f"/caches/c/jobs/{JOB}")}}


def text_of(page: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", page).split()).replace("&#39;", "'")


@pytest.fixture(scope="module")
def story(tmp_path_factory) -> dict[str, Any]:
    """A warm-up writes the job's step; the job hits it; the entry goes; the job compiles it (cold), then hits it."""
    base = tmp_path_factory.mktemp("savings")
    root, db = base / "cache", base / "catalog.sqlite"
    run(["-m", "jaxcache.warmup", "--topology", "1x1x2", "--platform", "cpu", "--cache-dir", str(root), "--job", JOB,
         "--entrypoint", EXAMPLE], env_of(root))
    (coverage,) = [json.loads(p.read_text()) for p in root.glob(".jaxcache/warmups/*.json")]
    (step,) = [p for p in coverage["programs"] if p["function"] == "jit_step" and p["status"] == "written"]
    key = step["key"]
    job = ["-m", "jaxcache.warmup.examples", "--devices", "2"]
    first = exit_line(run(job, env_of(root)))
    before = seen_by_service(root, db, key)
    for name in (f"{key}-cache", f"{key}-atime"):
        (root / name).unlink(missing_ok=True)
    cold = exit_line(run(job, env_of(root)))
    warm = exit_line(run(job, env_of(root)))
    after = seen_by_service(root, db, key)
    return {"root": root, "key": key, "warmup_s": step["compile_s"], "lines": (first, cold, warm),
            "runs": run_records(root), "before": before, "after": after}


def _usage(record: records.RunRecord, key: str) -> records.KeyUsage:
    (usage,) = [u for u in record.keys if u.key == key]
    return usage


def test_a_warmups_program_is_credited_with_its_time_on_its_machine_said_so(story):
    key, (first, _, _) = story["key"], story["lines"]
    saved, basis = saved_of(first)
    assert basis == f"at the writer's time, compiled on {MACHINE}", first
    hit = _usage(story["runs"][0], key)
    assert hit.hits == 1 and saved == pytest.approx(max(story["warmup_s"] - hit.retrieval_s, 0.0), abs=0.051)
    seen = story["before"]
    job, entry = seen["job"], seen["entry"]
    assert job["saved_s"] == pytest.approx(saved, abs=0.051) and job["saved_writer_s"] == job["saved_s"], job
    assert entry["saved_basis"] == "writer" and entry["platform_compile_s"] is None, entry
    assert entry["measured_compile_s"] == story["warmup_s"] and entry["first_writer"]["machine"] == MACHINE, entry
    page = text_of(seen["pages"][f"/caches/c/entries/{key}"])
    assert f"each hit credited with the writer's compile s: at the writer's time, on {MACHINE}" in page, page
    assert "(all at the writer's time)" in text_of(seen["pages"][f"/caches/c/jobs/{JOB}"])


def test_once_the_job_compiled_it_on_its_platform_every_hit_is_credited_with_that(story):
    key, (_, cold, warm) = story["key"], story["lines"]
    first_run, cold_run, warm_run = story["runs"]
    measure = _usage(cold_run, key).compile_s
    assert measure is not None and _usage(cold_run, key).compiles == 1, cold
    saved, basis = saved_of(warm)
    assert basis == "measured on cpu", warm  # its own earlier (cold) run's compile, read from the job's index
    seen = story["after"]
    entry = seen["entry"]
    assert entry["saved_basis"] == "platform" and entry["platform_compile_s"] == measure, entry
    assert entry["platform_machine"] == MACHINE and entry["measured_compile_s"] == story["warmup_s"], entry
    runs = {r["run_id"]: r for r in seen["job"]["recent_runs"]}
    assert runs[warm_run.run_id]["saved_s"] == pytest.approx(saved, abs=0.051), (runs, warm)
    assert runs[warm_run.run_id]["saved_writer_s"] == 0.0
    # The warm-up's hit is credited again, now by the platform's own time (the service knows it now).
    hit = _usage(first_run, key)
    assert runs[first_run.run_id]["saved_s"] == pytest.approx(max(measure - hit.retrieval_s, 0.0), rel=1e-9)
    assert runs[first_run.run_id]["saved_writer_s"] == 0.0 and seen["job"]["saved_writer_s"] == 0.0
    page = text_of(seen["pages"][f"/caches/c/entries/{key}"])
    assert f"each hit credited with the platform compile s, measured on {MACHINE}" in page, page


# --- one name per figure -------------------------------------------------------------------------------------------


def glossary() -> list[dict[str, str]]:
    """The user guide's table of figures: one dict per row, by column."""
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    section = guide.split("## Compile seconds and seconds saved: one name per figure", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def spellings(cell: str) -> list[str]:
    """What a cell names: its code spans, else its text; none for a dash."""
    return re.findall(r"`([^`]+)`", cell) or ([] if cell in ("–", "") else [cell])


def labels(page: str) -> set[str]:
    """A page's table headers and stat labels (what a figure is called there)."""
    return {" ".join(re.sub(r"<[^>]+>", " ", found).split()).replace("&#39;", "'")
            for found in re.findall(r"<(?:th|dt)\b[^>]*>(.*?)</(?:th|dt)>", page, re.S)}


def test_each_figure_has_one_name_everywhere_the_docs_table_says(story):
    rows = glossary()
    figures = {row["figure"] for row in rows}
    assert {"stored compile s", "writer's compile s", "platform compile s", "saved s"} <= figures, figures
    lines = " ".join(story["lines"])
    ls = run(["-m", "jaxcache", "ls", str(story["root"])], env_of(story["root"])).stdout
    stats = run(["-m", "jaxcache", "stats", str(story["root"])], env_of(story["root"])).stdout
    schemas = story["after"]["openapi"]["components"]["schemas"]
    fields = {name: prop.get("description", "") for schema in schemas.values()
              for name, prop in schema.get("properties", {}).items()}
    pages = [*story["before"]["pages"].values(), *story["after"]["pages"].values()]
    shown = set().union(*(labels(p) for p in pages))
    for row in rows:
        for said in spellings(row["job summary"]):
            assert said in lines, (row["figure"], said, lines)
        for said in spellings(row["`jaxcache` CLI"]):
            assert said in ls + stats, (row["figure"], said)
        for field in spellings(row["API field"]):
            assert field in fields, (row["figure"], field)
        if row["dashboard"] not in ("–", "at the writer's time"):
            assert any(label.startswith(row["dashboard"]) for label in shown), (row["figure"], sorted(shown))
    assert any("at the writer's time" in text_of(p) for p in pages)
    # Every description of those fields that names a figure names its own row's; every dashboard label about
    # compile time or seconds saved is a row's name.
    by_field = {f: row["figure"] for row in rows for f in spellings(row["API field"])}
    for schema in schemas.values():
        for name, prop in schema.get("properties", {}).items():
            said = prop.get("description", "").split(":", 1)[0]
            if name in by_field and said in figures:
                assert said == by_field[name], (name, prop["description"])
    names = {row["dashboard"] for row in rows if row["dashboard"] != "–"}
    about = [label for label in shown if re.search(r"compile (s|time|seconds)\b|saved", label, re.I)]
    assert about and all(re.sub(r" \(7 d\)$", "", label) in names for label in about), (about, names)


# --- an entry no record measured; the line a plain script sees -----------------------------------------------------


def restore_stored_seconds(path: Path, seconds: int) -> None:
    """Rewrite a zstd entry's stored compile seconds (its first 4 bytes, big-endian, inside the frame)."""
    data = path.read_bytes()
    assert data[:4] == b"\x28\xb5\x2f\xfd", "a zstd entry"
    plain = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    path.write_bytes(zstandard.ZstdCompressor().compress(struct.pack(">I", seconds) + plain[4:]))


def test_a_plain_script_shows_its_line_and_an_unmeasured_entry_is_the_stored_seconds(tmp_path):
    root = tmp_path / "cache"
    run(["-c", SQUARE_JOB], env_of(root))
    shutil.rmtree(root / ".jaxcache")  # as if plain JAX had written it: no record says who, or how long it took
    (entry,) = root.glob("jit_square-*-cache")
    key = entry.name.removesuffix("-cache")
    restore_stored_seconds(entry, 40)
    proc = run(["-c", SQUARE_JOB], env_of(root))
    line = exit_line(proc)  # nothing configured, and the line is there: on stderr, once
    assert proc.stderr.splitlines()[-1] == line and proc.stdout == "", proc.stderr
    saved, basis = saved_of(line)
    assert basis == "at the writer's time: the whole seconds JAX stored" and 39.0 < saved <= 40.0, line
    seen = seen_by_service(root, tmp_path / "catalog.sqlite", key)
    assert seen["entry"]["saved_basis"] == "stored" and seen["entry"]["compile_seconds"] == 40, seen["entry"]
    assert seen["job"]["saved_s"] == pytest.approx(saved, abs=0.051) and seen["job"]["saved_writer_s"] == seen[
        "job"]["saved_s"], seen["job"]
    quiet = run(["-c", SQUARE_JOB], env_of(root, JAXCACHE_SUMMARY="off"))
    assert "jaxcache: job" not in quiet.stderr, quiet.stderr
    with pytest.raises(InvalidInputError, match="JAXCACHE_SUMMARY='loud': use one of auto, stderr, log, off"):
        exit_summary.where({"JAXCACHE_SUMMARY": "loud"})


LOGGED_JOB = """
import logging, sys
logging.basicConfig(format="%(levelname)s %(name)s %(message)s")
logging.getLogger("jaxcache").setLevel(logging.INFO)  # jaxcache's own INFO, as the README says
""" + SQUARE_JOB

ROOT_AT_INFO = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
from jaxcache.storage import open_storage
list(open_storage(sys.argv[1]).iter_objects(""))
"""


def test_info_on_jaxcache_logs_the_line_once_and_no_azure_requests(azure_container, tmp_path):
    url = f"az://{azure_container}/jax-cache"
    proc = run(["-c", LOGGED_JOB], env_of(url, JAXCACHE_LOCAL_DIR=str(tmp_path / "local")))
    said = [line for line in proc.stderr.splitlines() if "jaxcache: job" in line]
    assert len(said) == 1 and said[0].startswith(f"INFO jaxcache.client jaxcache: job {JOB}: "), proc.stderr
    assert "Request URL" not in proc.stderr and " azure." not in proc.stderr, proc.stderr
    # What the README warns of: INFO on the root logger shows the Azure SDK's log of every request.
    flood = run(["-c", ROOT_AT_INFO, url], env_of(url))
    assert "INFO azure.core.pipeline.policies.http_logging_policy Request URL" in flood.stderr, flood.stderr
