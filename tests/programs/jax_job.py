"""A small JAX job that uses a shared persistent compilation cache and checks its own numbers.

Standalone on purpose (imports no jaxcache). Usage: python jax_job.py CACHE_DIR [--lru] [--rounds N]
Compiles a few jitted functions, N rounds, clearing JAX's in-memory caches between rounds so that every round
looks the programs up in the persistent cache again (hit, miss, or an entry deleted under its feet). Exits 0 and
prints "ok" when every result matches numpy; 1 with the mismatch otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache_dir")
    parser.add_argument("--lru", action="store_true", help="set jax_compilation_cache_max_size (JAX's own LRU)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["JAX_PLATFORMS"] = "cpu"

    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_compilation_cache_dir", args.cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if args.lru:
        jax.config.update("jax_compilation_cache_max_size", 512 * 1024 * 1024)

    def affine(x):
        return x * 2.0 + 1.0

    def gram(m):
        return m @ m.T

    def wave(x):
        return jnp.sin(x) ** 2 + jnp.cos(x) ** 2

    def loss(w, x):
        return jnp.sum((x @ w) ** 2)

    x = np.arange(8, dtype=np.float32)
    m = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    w = np.ones((4, 2), dtype=np.float32)
    checks = [
        ("affine", lambda: jax.jit(affine)(x), x * 2 + 1),
        ("gram", lambda: jax.jit(gram)(m), m @ m.T),
        ("wave", lambda: jax.jit(wave)(x), np.ones_like(x)),
        ("grad", lambda: jax.jit(jax.grad(loss))(w, m), 2 * m.T @ (m @ w)),
    ]
    for r in range(args.rounds):
        for name, run, want in checks:
            got = np.asarray(run())
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
                print(f"round {r} {name}: got {got!r}, want {want!r}", file=sys.stderr)
                return 1
        jax.clear_caches()  # the next round looks every program up in the persistent cache again
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
