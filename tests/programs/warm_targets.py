"""Warm-up entrypoints for tests: each one exercises one way a warm-up can go (imported by `warmup` via cwd)."""

from __future__ import annotations

import os


def nothing(ctx):
    """Compiles nothing at all."""


def broken(ctx):
    """Fails the way user code fails."""
    raise ValueError("the user's own bug")


def callbacks(ctx):
    """Programs with host callbacks, which jax 0.10 refuses to store."""
    import jax

    def noisy(x):
        jax.debug.print("x={x}", x=x)
        return x + 1

    ctx.compile(noisy, ctx.abstract((4,), "float32"))


def unstable(ctx):
    """A program that differs in every process (a pid baked in): a fresh verify process must miss it."""
    import jax.numpy as jnp

    pid = float(os.getpid())
    ctx.compile(lambda x: x * pid + jnp.sin(x), ctx.abstract((8,), "float32"))


def slow_to_verify(ctx):
    """Compiles, and hangs when run again (by --verify's fresh process): the marker file says it ran before."""
    import time
    from pathlib import Path

    marker = Path(os.environ["WARM_TARGETS_MARKER"])
    ctx.compile(lambda x: x * 2.0, ctx.abstract((8,), "float32"))
    if marker.exists():
        time.sleep(600)
    marker.touch()


def tpu_mesh(ctx):
    """A TPU slice's context: its chips as devices, a 2-D mesh over them, ctx.compile of a sharded program."""
    import jax.numpy as jnp

    devices = ctx.devices()
    kinds = {d.device_kind for d in devices}
    print(f"slice {ctx.topology.name} chips {ctx.global_devices} devices {len(devices)} kinds {sorted(kinds)}")
    mesh = ctx.mesh(("data", "model"), (ctx.global_devices // 2, 2))
    x = ctx.abstract((ctx.global_devices * 4, 64), "float32", ("data", "model"), mesh)
    w = ctx.abstract((64, 32), "float32", ("model", None), mesh)
    compiled = ctx.compile(lambda a, b: jnp.tanh(a @ b).sum(), x, w)
    print(f"compiled for {len(compiled.input_shardings[0][0].device_set)} devices")


def fails_on_two_devices(ctx):
    """The example's step, except on a 2-device target, where it fails as user code fails."""
    from jaxcache.warmup import examples

    if ctx.global_devices == 2:
        raise ValueError("this target's own bug")
    examples.warm(ctx)


def slices(ctx):
    """A multi-slice job's context: its slices, and 2-D hybrid meshes whose first (by default) or second axis spans
    them."""
    import jax.numpy as jnp

    devices = ctx.devices()
    print(f"slices {ctx.num_slices} devices {len(devices)} slice_index {sorted({d.slice_index for d in devices})}")
    for mesh in (ctx.mesh(("data", "model"), (ctx.global_devices // 2, 2)),
                 ctx.mesh(("data", "model"), (2, ctx.global_devices // 2), dcn_shape=(1, ctx.num_slices))):
        rows = [sorted({d.slice_index for d in row}) for row in mesh.devices]
        print(f"mesh {dict(mesh.shape)} slices by row {rows}")
    x = ctx.abstract((ctx.global_devices * 4, 64), "float32", ("data", "model"), mesh)
    ctx.compile(lambda a: jnp.tanh(a).sum(), x)
