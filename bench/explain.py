"""`jaxcache explain` over a root of many run records, against reading the same records with `json.load` in the
same run (the floor any explainer pays): time and peak memory. Figures, not assertions.

    .venv/bin/python bench/explain.py --records 10000 --keys 20
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
import tracemalloc


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build(root: str, n: int, keys: int) -> None:
    """``n`` records of ``keys`` keys each, over 200 functions: mostly hits, a miss in every tenth record with
    parts that differ from the entry that is there in the flags, the program or the devices; an entry file for
    half the functions."""
    from jaxcache import keyparts as kp
    from jaxcache import records

    now = time.time()
    fp = records.Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="cpu", device_count=8, compression="zstandard",
                             xla_flags=("--xla_cpu_enable_fast_math=false",))
    base = kp.KeyParts(**{p: h(p) for p in kp.ORDER})
    sig = kp.ProgramSignature(args=("f32[32,128]", "f32[128]"), results=("f32[32,128]",))
    for r in range(n):
        at = now - 86400 * (r % 20) - r
        usages = []
        for j in range(keys):
            f = f"jit_f{(r * keys + j) % 200}"
            key = f"{f}-{h(f)}"
            if j == 0 and r % 10 == 0:
                # A miss, as jobs have them: a few variants per function (flags, a shape, the devices).
                f = f"jit_f{r % 200}"
                part, variant = (("xla_flags", "A"), ("computation", str(r % 5)), ("devices", "4"))[r % 3]
                parts = kp.KeyParts(**{**{p: h(p) for p in kp.ORDER}, part: h(part + variant)})
                usages.append(records.KeyUsage(key=f"{f}-{h(f + part + variant)}", event="write", compiles=1,
                                               writes=1, compile_s=2.0, first_at=at, parts=parts, program=sig))
            else:
                usages.append(records.KeyUsage(key=key, event="hit", hits=3, first_at=at, last_at=at, parts=base,
                                               program=sig))
        rec = records.RunRecord(job=f"job{r % 7}", run_id=f"r{r}", process_index=0, process_count=1, host="h",
                                started_at=at, updated_at=at + 60, fingerprint=fp, final=True, keys=usages)
        path = os.path.join(root, rec.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(rec.to_json())
    for i in range(0, 200, 2):
        f = f"jit_f{i}"
        with open(os.path.join(root, f"{f}-{h(f)}-cache"), "wb") as fh:
            fh.write(b"\x28\xb5\x2f\xfd" + b"\0" * 60)


def measure(fn) -> tuple[float, float]:
    """Seconds of one call (untraced: tracing memory slows Python code), then its peak memory from another."""
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from jaxcache.cli.explain import explained
    from jaxcache.storage import open_storage

    root = tempfile.mkdtemp(prefix="jaxcache-bench-explain-")
    try:
        build(root, args.records, args.keys)
        files = glob.glob(os.path.join(root, ".jaxcache", "runs", "*", "*.json"))

        def baseline() -> None:
            for path in files:
                with open(path) as fh:
                    json.load(fh)

        found: list = []
        runs = {"json.load": [measure(baseline) for _ in range(args.repeat)],
                "explain": [measure(lambda: found.append(explained(open_storage(root)))) for _ in range(args.repeat)]}
        misses = found[-1][0]
        base_s = statistics.median(s for s, _ in runs["json.load"])
        for name, samples in runs.items():
            s, mib = statistics.median(x for x, _ in samples), max(m for _, m in samples)
            print(f"{name:10s} {s:7.3f} s  peak {mib:7.1f} MiB  ({s / base_s:.2f}x json.load)")
        causes = sorted({m["cause"] for m in misses})
        print(f"{len(files)} records, {len(misses)} misses explained: {causes}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
