"""A job for the key-parts tests (tests/test_key_parts.py): compiles named programs through jaxcache.client and
prints its run record (as JSON) and summary as one JSON line. Logs go to stderr with ``logging.basicConfig``
at INFO, as a user's script would set it up: what the client captures must not show there.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--programs", default="scale8,scale16,gram")
    parser.add_argument("--devices", type=int, default=2, help="jax_num_cpu_devices")
    parser.add_argument("--then-min-compile-s", type=float, help="raise JAX's threshold, then compile --then")
    parser.add_argument("--then", default="", help="programs compiled after raising the threshold")
    parser.add_argument("--moved", action="store_true", help="simulate a JAX that logs no key parts")
    # JAX hashes every command-line argument that starts with --xla into keys (XLA itself never reads them).
    args, rest = parser.parse_known_args()
    if any(not arg.startswith("--xla") for arg in rest):
        parser.error(f"unknown arguments {rest}")
    os.environ["JAX_PLATFORMS"] = "cpu"
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")

    import jax
    import numpy as np

    from jaxcache.client import enable_cache
    from jaxcache.client import jax_internals as ji

    if args.moved:
        for name in ("PART_MSG", "SO_FAR_MSG", "FLAG_MSG"):
            setattr(ji, name, ji.LogText("no JAX logs this", ji.KEY_LOGGER))
    jax.config.update("jax_num_cpu_devices", args.devices)
    session = enable_cache(args.cache_dir, min_compile_time_secs=0, min_entry_size_bytes=-1, trust="off")

    # Named functions, numpy inputs: each call is one program (jit_scale, ...), and nothing else compiles.
    def scale(v):
        return v * 3.0

    def gram(a):
        return a @ a.T

    def shift(v):
        return v - 1.0

    programs = {
        "scale8": lambda: jax.jit(scale)(np.ones(8, np.float32)),
        "scale16": lambda: jax.jit(scale)(np.ones(16, np.float32)),
        "gram": lambda: jax.jit(gram)(np.ones((3, 4), np.float32)),
        "shift": lambda: jax.jit(shift)(np.ones(4, np.float32)),
    }
    for name in filter(None, args.programs.split(",")):
        jax.block_until_ready(programs[name]())
    if args.then_min_compile_s is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", args.then_min_compile_s)
    for name in filter(None, args.then.split(",")):
        jax.block_until_ready(programs[name]())

    record = session.flush()
    print(json.dumps({"record": json.loads(record.to_json()), "summary": session.summary(),
                      "run_id": session.run_id, "cache_dir": session.cache_dir}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
