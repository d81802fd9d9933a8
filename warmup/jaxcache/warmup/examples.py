"""A worked example: one data-parallel train step, warmed up without data and then run by the real job.

The rule that makes a warm-up useful: the job must build *the same programs* — same function, shapes, dtypes,
shardings and mesh — as the entrypoint compiles. Sharing the builder (as :func:`train_step` does here) is the
simplest way to keep them in step.

Warm up a cache for a 4-device CPU job, then run the job::

    warmup --topology 1x1x4 --platform cpu --cache-dir /tmp/cache --entrypoint jaxcache.warmup.examples:warm
    JAXCACHE_DIR=/tmp/cache python -m jaxcache.warmup.examples --steps 3
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

FEATURES = 64
HIDDEN = 128
PER_DEVICE_BATCH = 8


def train_step(mesh: Any) -> tuple[Any, Any, Any]:
    """The jitted step for ``mesh`` and its input shardings: ``(step, params_sharding, batch_sharding)``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    def loss(params: dict[str, Any], x: Any, y: Any) -> Any:
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def step(params: dict[str, Any], x: Any, y: Any) -> tuple[dict[str, Any], Any]:
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads), value

    replicated = NamedSharding(mesh, PartitionSpec())
    by_batch = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    params_sharding = {"w1": replicated, "b1": replicated, "w2": replicated}
    jitted = jax.jit(step, in_shardings=(params_sharding, by_batch, by_batch),
                     out_shardings=(params_sharding, replicated))
    return jitted, params_sharding, by_batch


def shapes(devices: int, per_device_batch: int = PER_DEVICE_BATCH) -> dict[str, tuple[int, ...]]:
    """Array shapes for a job over ``devices`` devices."""
    batch = per_device_batch * devices
    return {"w1": (FEATURES, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, 1), "x": (batch, FEATURES), "y": (batch, 1)}


def warm(ctx: Any) -> None:
    """Warm-up entrypoint: compile the step for the target topology, with abstract inputs only."""
    mesh = ctx.mesh(("data",))
    step, params_sharding, by_batch = train_step(mesh)
    s = shapes(ctx.global_devices)
    params = {name: ctx.abstract(s[name], "float32", mesh=mesh) for name in params_sharding}
    x = ctx.abstract(s["x"], "float32", ("data",), mesh)
    y = ctx.abstract(s["y"], "float32", ("data",), mesh)
    step.lower(params, x, y).compile()


def run_job(steps: int, per_device_batch: int = PER_DEVICE_BATCH) -> float:
    """The real job: the same step on every local device, with data. Returns the last loss."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    step, params_sharding, by_batch = train_step(mesh)
    s = shapes(jax.device_count(), per_device_batch)
    rng = np.random.default_rng(0)
    params = {n: jax.device_put(rng.standard_normal(s[n]).astype(np.float32) * 0.1, params_sharding[n])
              for n in params_sharding}
    x = jax.device_put(rng.standard_normal(s["x"]).astype(np.float32), by_batch)
    y = jax.device_put(rng.standard_normal(s["y"]).astype(np.float32), by_batch)
    value: Any = None
    for _ in range(steps):
        params, value = step(params, x, y)
    return float(value)


def main(argv: list[str] | None = None) -> int:
    """Run the example job with the cache from JAXCACHE_DIR; the client says its one-line summary at exit (stderr)."""
    parser = argparse.ArgumentParser(description="the example job that jaxcache.warmup.examples:warm warms up")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--devices", type=int, help="CPU devices (jax_num_cpu_devices); default: JAX's")
    parser.add_argument("--per-device-batch", type=int, default=PER_DEVICE_BATCH,
                        help=f"examples per device (default {PER_DEVICE_BATCH}, what the warm-up compiles for): "
                             "another size is another program, a miss that `jaxcache explain` explains")
    args = parser.parse_args(argv)
    import jax

    from jaxcache.client import enable_cache

    if args.devices:
        jax.config.update("jax_num_cpu_devices", args.devices)
    enable_cache()
    loss = run_job(args.steps, args.per_device_batch)
    print(f"loss {loss:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
