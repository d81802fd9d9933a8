"""What naming each key's compile options costs: reading them (the client, per key JAX computes) against compiling
the program, and validating a run record whose keys carry them against the same record without (the service, per
report), in the same run. Figures, not assertions.

    .venv/bin/python bench/option_fields.py --params 48 --keys 200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def best_of(fn, rounds: int, inner: int) -> float:
    """The fastest of ``rounds`` mean times of ``inner`` calls (another process taking a core only adds time)."""
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t) / inner)
    return min(out)


def client(params: int, rounds: int) -> dict:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    from jax._src import compilation_cache as cc

    from jaxcache.client.jax_internals.compile_options import hashed_fields

    caught = []
    original = cc.get_cache_key

    def get_cache_key(module, devices, options, backend, *args, **kwargs):
        caught.append((options, backend.platform))
        return original(module, devices, options, backend, *args, **kwargs)

    cc.get_cache_key = get_cache_key  # to catch the options JAX builds; a key is computed only with a cache set
    jax.config.update("jax_compilation_cache_dir", os.path.join(os.environ.get("TMPDIR", "/tmp"), "jc-optbench"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 3600)  # look keys up, write nothing
    weights = {f"w{i:03}": jnp.ones((64, 64)) for i in range(params)}

    def trainer(scale: float):
        def step(w, x):
            for name in sorted(w):
                x = jnp.tanh(x @ w[name])
            return x.sum() * scale

        return jax.jit(jax.grad(step))

    x = jnp.ones((8, 64))
    scales = iter(range(1, 10**6))  # a new constant each time: a new program, compiled (JAX keeps compiled ones)
    compile_s = best_of(lambda: trainer(float(next(scales))).lower(weights, x).compile(), rounds, 1)
    trainer(0.5)(weights, x)
    options, platform = caught[-1]
    fields = hashed_fields(options, platform) or ()
    read_s = best_of(lambda: hashed_fields(options, platform), rounds, 20)
    return {"params": params, "compile_ms": compile_s * 1e3, "read_ms": read_s * 1e3, "read_over_compile":
            read_s / compile_s, "fields": len(fields), "fields_json_bytes": len(json.dumps(fields)),
            "fields_seen": dict(fields)}


def service(keys: int, fields: dict[str, str], rounds: int) -> dict:
    from jaxcache import keyparts as kp
    from jaxcache import records

    def record(options) -> bytes:
        usages = [records.KeyUsage(key=f"jit_f{i}-" + "a" * 64, event="hit", hits=3, first_at=1.7e9, last_at=1.7e9,
                                   parts=kp.KeyParts(**{p: "d" * 64 for p in kp.ORDER}, options=options),
                                   program=kp.ProgramSignature(args=("f32[8,128]",) * 4, results=("f32[8]",)))
                  for i in range(keys)]
        return records.RunRecord(job="train", run_id="r1", process_index=0, process_count=1, host="h",
                                 started_at=1.7e9, updated_at=1.7e9, fingerprint=records.Fingerprint(
                                     jax="0.10.2", jaxlib="0.10.2"), keys=usages).to_json()

    without, with_ = record(None), record(tuple(sorted(fields.items())))
    # Rounds alternate the two, each round's ratio pairs runs made close in time (the machine drifts between).
    pairs = [(best_of(lambda: records.parse(without), 1, 20), best_of(lambda: records.parse(with_), 1, 20))
             for _ in range(rounds)]
    return {"keys": keys, "bytes_without": len(without), "bytes_with": len(with_),
            "parse_ms_without": min(p for p, _ in pairs) * 1e3, "parse_ms_with": min(n for _, n in pairs) * 1e3,
            "parse_ratio_median": statistics.median(n / p for p, n in pairs)}


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/option_fields.py", description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=48, help="weight matrices of the program (default 48)")
    ap.add_argument("--keys", type=int, default=200, help="keys of the run record (default 200)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds; the fastest is kept (default 7)")
    args = ap.parse_args()
    got = client(args.params, args.rounds)
    got.update(service(args.keys, got.pop("fields_seen"), args.rounds))
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in got.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
