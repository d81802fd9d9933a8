"""`warmup --flags-from-job` over a root of many run records (#58 item 2): the job's newest record that lists
flags, found as the working set finds records (newest day first, stopping at the answer), against reading every
record whole (what `prune` does, and what --flags-from-job did), in the same run. Figures, not assertions.

    .venv/bin/python bench/flags_from_job.py --records 100000
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time


def build(root: str, n: int, every: int) -> None:
    """``n`` process-0 records over 13 days, the newest last; every ``every``-th is the job's, listing flags."""
    from jaxcache import records

    now = time.time()
    fp = records.Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="tpu", xla_flags=("--xla_tpu_x=true",))
    keys = [records.KeyUsage(key=f"jit_f{i}-{i:064x}", event="hit", hits=1) for i in range(20)]
    for i in range(n):
        at = now - 13 * 86400 * (n - i) / n
        rec = records.RunRecord(job="pretrain" if i % every == 0 else f"other{i % 37}", run_id=f"r{i}",
                                process_index=0, process_count=1, host="h", started_at=at, updated_at=at,
                                fingerprint=fp, keys=keys)
        path = os.path.join(root, rec.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(rec.to_json())
        os.utime(path, (at, at))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--every", type=int, default=50, help="one record in this many is the job's")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    from jaxcache.client import jax_internals  # noqa: F401 - JAX imported before anything is timed
    from jaxcache.storage import open_storage
    from jaxcache.usage import read_usage
    from jaxcache.warmup.tpu import flags_from_job

    root = tempfile.mkdtemp(prefix="jaxcache-flags-")
    try:
        build(root, args.records, args.every)
        for _ in range(args.repeat):
            timed = []
            for run in (read_usage, lambda s: flags_from_job(s, "pretrain")):
                storage = open_storage(root)
                started = time.perf_counter()
                run(storage)
                timed.append((time.perf_counter() - started, storage.reads))
            (base, base_reads), (new, new_reads) = timed
            print(f"{args.records} records: every record {base:.2f} s ({base_reads} reads), flags-from-job"
                  f" {new:.3f} s ({new_reads} reads): ratio {new / base:.4f}", flush=True)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
