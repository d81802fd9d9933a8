"""Fill a demo cache by compiling a small model with JAX on the CPU.

``python -m jaxcache.warmup.demo ./demo-cache``: thresholds are lowered so that every program is stored, which
is what a newcomer needs to have something to look at (real jobs keep JAX's 1-second default).
"""

from __future__ import annotations

import argparse
import os
import sys

from jaxcache.units import plural


def fill(cache_dir: str, *, layers: int = 4, width: int = 128) -> int:
    """Compile a small MLP's train step, its evaluation and a few helpers into ``cache_dir``.

    Returns the number of ``-cache`` files in the directory afterwards.
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp

    cache_dir = os.path.abspath(cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    # JAX's own LRU writes -atime files, so the demo shows last-used times too.
    jax.config.update("jax_compilation_cache_max_size", 256 * 1024 * 1024)

    key = jax.random.PRNGKey(0)
    params = []
    for _ in range(layers):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (width, width)) * 0.05, jnp.zeros(width)))

    def forward(params, x):
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        return x @ w + b

    def loss(params, x, y):
        return jnp.mean((forward(params, x) - y) ** 2)

    @jax.jit
    def train_step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return [(w - 0.01 * gw, b - 0.01 * gb) for (w, b), (gw, gb) in zip(params, grads, strict=True)]

    @jax.jit
    def evaluate(params, x, y):
        return loss(params, x, y)

    @jax.jit
    def normalize(x):
        return (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)

    x = jax.random.normal(key, (64, width))
    y = jnp.sin(x)
    for batch in (64, 32):  # two batch sizes: two programs per function, as real jobs often have
        xb, yb = normalize(x[:batch]), y[:batch]
        params = train_step(params, xb, yb)
        jax.block_until_ready(evaluate(params, xb, yb))
    return sum(1 for n in os.listdir(cache_dir) if n.endswith("-cache"))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m jaxcache.warmup.demo", description=__doc__.splitlines()[0])
    parser.add_argument("cache_dir", nargs="?", default="./demo-cache", help="where to write (default ./demo-cache)")
    args = parser.parse_args(argv)
    count = fill(args.cache_dir)
    print(f"demo cache {os.path.abspath(args.cache_dir)}: {plural(count, 'entry')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
