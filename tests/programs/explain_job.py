"""A job whose programs can be made to miss on purpose, one way per flag: tests run it in fresh processes and ask
`jaxcache explain` why. Prints one JSON line: the run id, the misses and hits, and the client's summary.

--plain runs JAX's own cache without jaxcache (no run record), as a job that never heard of it would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--job", default="train")
    ap.add_argument("--rows", type=int, default=32, help="the program's input has this many rows")
    ap.add_argument("--then-rows", type=int, action="append", default=[],
                    help="then call the program again, in the same run, with this many rows")
    ap.add_argument("--devices", type=int, help="CPU devices (jax_num_cpu_devices)")
    ap.add_argument("--place", choices=["all", "second"],
                    help="place all arguments, or only the second, replicated over a mesh of every device (an "
                         "argument not placed is uncommitted: XLA may choose its sharding)")
    ap.add_argument("--compiler-option", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--unstable", action="store_true", help="bake a value that changes every run into the program")
    ap.add_argument("--default-thresholds", action="store_true", help="JAX's 1 s minimum compile time to write")
    ap.add_argument("--plain", action="store_true", help="JAX's cache without jaxcache.client")
    ap.add_argument("--hide-zstandard", action="store_true", help="JAX compresses with zlib (plain only)")
    ap.add_argument("--age-entries", type=float, metavar="SECONDS",
                    help="right before the first call, make the local cache's entries this much older than now (an"
                         " entry written that long before this job's lookup)")
    ap.add_argument("--on-the-second", action="store_true",
                    help="make the first call just after a whole second, so that what the run writes in that second "
                         "reads, on a store whose mtimes are whole seconds (S3, Azure), as written at its start: "
                         "before the run's first lookup")
    args = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.hide_zstandard:
        sys.modules["zstandard"] = None  # type: ignore[assignment]  # import fails: JAX falls back to zlib

    import jax

    if args.devices:
        jax.config.update("jax_num_cpu_devices", args.devices)
    session = None
    if args.plain:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    else:
        from jaxcache.client import enable_cache

        thresholds = {} if args.default_thresholds else {"min_compile_time_secs": 0, "min_entry_size_bytes": -1}
        session = enable_cache(args.cache_dir, job=args.job, trust="off", **thresholds)

    import jax.numpy as jnp
    import numpy as np

    salt = float(time.time_ns() % 997) if args.unstable else 0.0
    options = {name: {"true": True, "false": False}.get(value, value)
               for name, value in (o.split("=", 1) for o in args.compiler_option)}

    def step(a, b):
        return jnp.tanh(a @ b + salt).sum(axis=0)

    compiled = jax.jit(step, compiler_options=options or None)
    def placed(value, which):
        if args.place is None or (args.place == "second" and which == 0):
            return value
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = jax.make_mesh((len(jax.devices()),), ("x",))
        return jax.device_put(value, NamedSharding(mesh, PartitionSpec()))

    if args.age_entries is not None:
        from pathlib import Path

        then = time.time() - args.age_entries
        for entry in Path(args.cache_dir).glob("*-cache"):
            os.utime(entry, (then, then))
    if args.on_the_second:
        time.sleep(1.0 - time.time() % 1.0)
    for rows in (args.rows, *args.then_rows):
        out = compiled(placed(np.ones((rows, 16), np.float32), 0), placed(np.ones((16, 8), np.float32), 1))
        jax.block_until_ready(out)
    if session is None:
        print(json.dumps({"plain": True}))
        return 0
    session.wait_for_attestations()  # what the final record says of each write, as at exit
    record = session.flush()
    usages = [{"key": u.key, "function": u.function, "event": u.event} for u in record.keys]
    print(json.dumps({"run_id": record.run_id, "keys": usages, "summary": session.summary()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
