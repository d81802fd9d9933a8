"""One process of a 2-process jax.distributed job that only compiles (bench/gpu_check.sh, step 2).

Usage: python bench/gpu_two_process.py COORDINATOR PROCESS_ID CACHE_DIR
Compiles jaxcache.warmup.examples' train step for the 2-process mesh with abstract inputs (no execution, so
two processes can share one GPU) and prints one JSON line: process index, hits, misses, and the keys.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    coordinator, process_id, cache_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    from jaxcache.client import enable_cache

    session = enable_cache(cache_dir, job="gpu-check-2p")
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from jaxcache.warmup import examples

    jax.distributed.initialize(coordinator, num_processes=2, process_id=process_id)
    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    step, params_sharding, by_batch = examples.train_step(mesh)
    s = examples.shapes(jax.device_count())
    params = {n: jax.ShapeDtypeStruct(s[n], np.float32, sharding=params_sharding[n]) for n in params_sharding}
    x = jax.ShapeDtypeStruct(s["x"], np.float32, sharding=by_batch)
    y = jax.ShapeDtypeStruct(s["y"], np.float32, sharding=by_batch)
    step.lower(params, x, y).compile()
    stats = session.stats()
    record = session.flush()
    print(json.dumps({"process_index": jax.process_index(), "devices": jax.device_count(), "hits": stats.hits,
                      "misses": stats.misses, "keys": [u.key for u in record.keys]}), flush=True)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
