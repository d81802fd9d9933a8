"""What explaining misses at ingestion costs: 1,000 run records ingested with and without it, into fresh SQLite
catalogs, alternating, in the same run. Figures, not assertions.

    .venv/bin/python bench/explain.py --records 1000

Two shapes: ``records`` is bench/records.py's (each process one hit and one write, no key parts: every record has
a miss); ``jobs`` is a job's life (runs of several processes over 30 functions with key parts: a first run that
compiles everything, runs that hit, and a run whose XLA flags changed and compile again). Each is ingested as
POSTs are when the drain keeps up (one record at a time, each folded and explained as it arrives) and as a
rescan does (all its records drained at once, explained at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from unittest import mock


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build(shape: str, n: int) -> list:
    from jaxcache import keyparts as kp
    from jaxcache import records
    from jaxcache.keyparts import KeyParts, ProgramSignature

    now = time.time() - 86400
    out = []
    if shape == "records":
        for i in range(n):
            at = now + i * 10
            out.append(records.RunRecord(
                job="bench", run_id=f"r{i}", process_index=0, process_count=1, host="h", started_at=at,
                updated_at=at + 60, final=True, fingerprint=records.Fingerprint(jax="0.12.0", jaxlib="0.12.0"),
                keys=[records.KeyUsage(key=f"jit_f{i % 50}-{i % 50:064x}", event=records.HIT, hits=2, first_at=at),
                      records.KeyUsage(key=f"jit_w-{i:064x}", event=records.WRITE, writes=1, compiles=1,
                                       compile_s=1.5, first_at=at)]))
        return out
    sig = ProgramSignature(args=("f32[32,128]",), results=("f32[32,128]",))
    processes, functions = 8, 30
    for run in range(n // processes):
        flags = "--xla_a=1" if run < (n // processes) // 2 else "--xla_a=2"
        fp = records.Fingerprint(jax="0.12.0", jaxlib="0.12.0", backend="cpu", device_count=processes,
                                 process_count=processes, xla_flags=(flags,))
        at = now + run * 600
        first_of_flags = run in (0, (n // processes) // 2)
        for p in range(processes):
            keys = []
            for f in range(functions):
                parts = KeyParts(**{part: _h(f"{part}{f}" + (flags if part == kp.XLA_FLAGS else ""))
                                    for part in kp.ORDER})
                key = f"jit_fn{f}-{_h(f'{f}{flags}')}"
                if first_of_flags:
                    event = records.WRITE if p == 0 else records.COMPILED
                    keys.append(records.KeyUsage(key=key, event=event, compiles=1, writes=int(p == 0),
                                                 compile_s=2.0, first_at=at + f, parts=parts, program=sig,
                                                 reason=None if p == 0 else "only process 0 writes the cache"))
                else:
                    keys.append(records.KeyUsage(key=key, event=records.HIT, hits=3, first_at=at + f, parts=parts,
                                                 program=sig))
            out.append(records.RunRecord(job="train", run_id=f"run{run:04d}", process_index=p,
                                         process_count=processes, host=f"h{p}", started_at=at, updated_at=at + 300,
                                         final=True, fingerprint=fp, keys=keys))
    return out


def _catalog(work: str, i: int):
    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import CacheRow

    catalog = Catalog(f"sqlite:///{work}/c{i}.sqlite")
    with catalog.session() as s:
        s.add(CacheRow(name="bench", url="/bench"))
    return catalog


def _unexplained():  # type: ignore[no-untyped-def]
    """Misses stored unexplained: the arm without explanations."""
    from collections import Counter

    from jaxcache.service.reports.ingest import misses as explaining

    return mock.patch.object(explaining, "explain_pending", lambda *a, **k: Counter())


def posts(work: str, i: int, recs: list, explain: bool) -> float:
    from jaxcache.service.reports.ingest.queue import ingest

    catalog = _catalog(work, i)
    t = time.perf_counter()
    with contextlib.nullcontext() if explain else _unexplained():
        for r in recs:
            ingest(catalog, "bench", r)
    seconds = time.perf_counter() - t
    catalog.dispose()
    return seconds


def rescan(work: str, i: int, recs: list, explain: bool) -> float:
    from jaxcache.service.rounds import rescan
    from jaxcache.storage import open_storage

    root = os.path.join(work, f"root{i}")
    for r in recs:
        path = os.path.join(root, r.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(r.to_json())
    catalog, storage = _catalog(work, i), open_storage(root)
    t = time.perf_counter()
    with contextlib.nullcontext() if explain else _unexplained():
        result = rescan(catalog, "bench", storage)
    seconds = time.perf_counter() - t
    assert result.records_ingested == len(recs), result
    catalog.dispose()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="jaxcache-bench-explain-")
    figures = {}
    try:
        i = 0
        for shape in ("records", "jobs"):
            recs = build(shape, args.records)
            for path, run in (("post", posts), ("rescan", rescan)):
                times: dict[bool, list[float]] = {True: [], False: []}
                for _ in range(args.repeat):
                    for explain in (False, True):
                        i += 1
                        times[explain].append(run(work, i, recs, explain))
                off, on = statistics.median(times[False]), statistics.median(times[True])
                figures[f"{shape}/{path}"] = {"records": len(recs), "without_s": round(off, 3),
                                              "with_s": round(on, 3), "ratio": round(on / off, 3)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    print(f"medians of {args.repeat} runs, each into a fresh SQLite catalog")
    for name, f in figures.items():
        print(f"{name:16} {f['records']} records: {f['without_s']:.3f} s without explanations, {f['with_s']:.3f} s "
              f"with: ratio {f['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    raise SystemExit(main())
