"""What the working-set tests share: run and coverage records written under a root as the client and warm-up write
them (``jaxcache.working_set.from_root`` reads them; the service ingests them)."""

from __future__ import annotations

import os
import time

from jaxcache import coverage, records
from jaxcache.records import Fingerprint, KeyUsage, RunRecord
from jaxcache.storage import LocalStorage

NOW = time.time()
CPU8 = Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="cpu", device_kind="cpu", device_count=8)
CPU4 = Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="cpu", device_kind="cpu", device_count=4)
OLD = Fingerprint(jax="0.9.0", jaxlib="0.9.0", backend="cpu", device_kind="cpu", device_count=8)


def key(n: int) -> str:
    return f"jit_f{n}-{n:064x}"


def use(n: int, event: str = records.HIT, at: float = 0.0) -> KeyUsage:
    """Key ``n`` used first ``at`` seconds after NOW - 1000; a write carries its digest (``n`` in hex)."""
    return KeyUsage(key=key(n), event=event, hits=int(event == records.HIT),  # type: ignore[arg-type]
                    compiles=int(event != records.HIT), writes=int(event == records.WRITE), first_at=NOW - 1000 + at,
                    sha256=f"{n:064x}" if event == records.WRITE else None)


def put_run(storage: LocalStorage, run: str, fp: Fingerprint, keys: list[KeyUsage], *, job: str = "train",
            ago_s: float = 0.0, process: int = 0, kind: str = records.JOB) -> RunRecord:
    """A final record started and last written ``ago_s`` before NOW (its file's mtime too)."""
    at = NOW - ago_s
    record = RunRecord(job=job, run_id=run, process_index=process, process_count=2, host="h", started_at=at,
                       updated_at=at, fingerprint=fp, keys=keys, kind=kind, final=True)  # type: ignore[arg-type]
    storage.write_atomic(record.name, record.to_json())
    os.utime(os.path.join(storage.root, record.name), (at, at))
    return record


def put_warmup(storage: LocalStorage, wid: str, fp: Fingerprint, statuses: dict[int, str], *, job: str = "train",
               ago_s: float = 0.0) -> None:
    """A warm-up finished ``ago_s`` before NOW (its file's mtime too), its programs in ``statuses``' order; a
    written one carries its digest."""
    at = NOW - ago_s
    programs = tuple(coverage.ProgramCoverage(key=key(n), function=f"f{n}", status=s,  # type: ignore[arg-type]
                                              sha256=f"{n:064x}" if s == coverage.WRITTEN else None)
                     for n, s in statuses.items())
    record = coverage.WarmupRecord(id=wid, job=job, topology="1x8x1", platform="cpu", started_at=at - 60,
                                   finished_at=at, fingerprint=fp, cache_dir=storage.root, programs=programs)
    storage.write_atomic(record.name, record.to_json())
    os.utime(os.path.join(storage.root, record.name), (at, at))
