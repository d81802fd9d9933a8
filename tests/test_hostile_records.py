"""A huge run record is never read whole (#58 item 3). Records have a 32 MiB bound (``records.MAX_RECORD_BYTES``,
``coverage.MAX_COVERAGE_BYTES``): every reader reads at most the bound plus one byte, and a record past it is
malformed, skipped and counted. The readers that read the whole object first: `doctor --verify`, `explain` and
`warmup --flags-from-job`; the others (prune, the working set, the service) read through the same one bounded read."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxcache import records
from jaxcache.errors import TooLargeError
from jaxcache.storage import open_storage
from test_bundles import written  # noqa: F401 - a fixture
from test_client_service import _env

GIB = 1 << 30
#: An address-space ceiling of 1.5 GiB: reading a 3 GiB record whole breaks it, the bound plus one byte does not.
LIMITED = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29)); from {0} import"
           " main; sys.exit(main(sys.argv[1:]))")
COMMANDS = {
    "doctor --verify": ("jaxcache.cli", ["doctor", "{root}", "--verify", "--json"]),
    "explain": ("jaxcache.cli", ["explain", "{root}", "--json"]),
    "warmup --flags-from-job": ("jaxcache.warmup.cli", ["--topology", "v5e:2x2", "--cache-dir", "{root}",
                                                        "--entrypoint", "jaxcache.warmup.examples:warm", "--dry-run",
                                                        "--flags-from-job", "nobody"]),
}


def huge_record(root: Path) -> Path:
    """A sparse 3 GiB object named like today's newest process-0 record of the job ``train``."""
    day = dt.datetime.now(dt.UTC).date().isoformat()
    path = root / records.RUNS_PREFIX / day / "huge-p0.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(3 * GIB)
    return path


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_huge_run_record_is_never_read_whole(written, tmp_path, command):  # noqa: F811
    root = tmp_path / "root"
    shutil.copytree(written, root)
    huge = huge_record(root)
    module, args = COMMANDS[command]
    proc = subprocess.run([sys.executable, "-c", LIMITED.format(module), *(a.format(root=root) for a in args)],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-3000:]
    name = huge.relative_to(root).as_posix()
    why = f"larger than {records.MAX_RECORD_BYTES} bytes"
    if command == "doctor --verify":
        out = json.loads(proc.stdout)
        assert proc.returncode == 0 and out["counts"]["ok"] == out["checked"] > 0, proc.stdout
        assert {"record": name, "error": why} in out["skipped_records"], out["skipped_records"]
    elif command == "explain":
        assert proc.returncode == 0 and json.loads(proc.stdout)["skipped_records"] == 1, proc.stdout
    else:  # no record of that job: one line, which counts the huge one skipped
        lines = [line for line in proc.stderr.splitlines() if line.startswith("warmup:")]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert "has no run record" in lines[0] and "(1 malformed record skipped)" in lines[0], lines


def _grown(storage, name: str, small: bytes, large: bytes, write) -> None:
    write(name, small)
    [listed] = [i for i in storage.iter_objects(records.RUNS_PREFIX, recursive=True) if i.name == name]
    assert storage.read_bounded(name, 64, listed_bytes=listed.size_bytes) == small
    write(name, large)  # replaced by a larger object after the listing
    with pytest.raises(TooLargeError, match="larger than 64 bytes"):
        storage.read_bounded(name, 64, listed_bytes=listed.size_bytes)
    write(name, large[:64])
    assert storage.read_bounded(name, 64, listed_bytes=listed.size_bytes) == large[:64]  # grown, within the bound
    assert storage.read_bounded(name, 64) == large[:64]
    assert storage.read_bounded(records.RUNS_PREFIX + "gone.json", 64) is None


def test_a_record_that_grew_since_it_was_listed_is_read_to_the_bound_only(tmp_path):
    storage = open_storage(tmp_path)
    name = records.RUNS_PREFIX + "2026-01-01/r-p0.json"

    def write(n: str, data: bytes) -> None:
        path = tmp_path / n
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    _grown(storage, name, b"{}", b"x" * (1 << 20), write)


@pytest.mark.gcs
def test_a_record_that_grew_in_a_gcs_root_is_read_by_range_to_the_bound_only(gcs_client, gcs_bucket):
    bucket = gcs_client.bucket(gcs_bucket)
    storage = open_storage(f"gs://{gcs_bucket}/jc")
    name = records.RUNS_PREFIX + "2026-01-01/r-p0.json"
    _grown(storage, name, b"{}", b"x" * (1 << 20),
           lambda n, data: bucket.blob(f"jc/{n}").upload_from_string(data))
