"""The job bench/start.py starts, a fresh process per run: ``--programs`` distinct jitted programs, each closing
over its own random float32 constant (embedded in the executable, so each entry is a few MB), run once each after
``enable_cache()`` and ``--startup-s`` seconds of start-up work. Prints one JSON line. JAX is imported only here."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def programs(count: int, floats: int):
    """``count`` jitted programs named ``prog_NN`` (the same in every process) and their one input."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def make(i: int):
        # A dot product with the input: XLA cannot fold the constant away, so its bytes stay in the executable.
        const = np.random.default_rng(36_000 + i).standard_normal(floats, dtype=np.float32)

        def prog(x):
            return jnp.dot(const, x)

        prog.__name__ = prog.__qualname__ = f"prog_{i:02d}"
        return jax.jit(prog)

    return [make(i) for i in range(count)], jax.device_put(np.ones(floats, np.float32))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--programs", type=int, required=True)
    parser.add_argument("--floats", type=int, required=True, help="float32 values in each program's constant")
    parser.add_argument("--startup-s", type=float, required=True, help="start-up work between enable_cache and "
                        "the first compile (a sleep)")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from jaxcache.client import enable_cache

    progs, x = programs(args.programs, args.floats)  # tracing happens at the first call, after t0
    print("ready", flush=True)  # the parent starts its clock (and any fault window), then answers
    sys.stdin.readline()
    t0_at = time.time()
    t0 = time.perf_counter()
    session = enable_cache(args.cache_dir, job="bench-start", min_compile_time_secs=0, min_entry_size_bytes=-1)
    enable_s = time.perf_counter() - t0
    time.sleep(args.startup_s)  # model init, checkpoint restore
    done = []
    for prog in progs:
        jax.block_until_ready(prog(x))
        done.append(time.perf_counter() - t0)
    loaded_at = time.time()
    s = session.stats()
    local = session.record().local
    out = {
        "t0_at": t0_at,
        "loaded_at": loaded_at,
        "loaded_s": done[-1],
        "enable_s": enable_s,
        "first_s": done[0],
        "stats": {k: getattr(s, k) for k in s.__slots__},
        "local": None if local is None else {f: getattr(local, f) for f in local.__struct_fields__},
        "local_dir": session.local_dir,
        "summary": session.summary(),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
