"""A 6-layer decoder train step: warmed up for a TPU slice on a CPU machine (``warm``), then run on the chip (``main``).

The warm-up and the job share :func:`build`, so they compile the same programs: same shapes, dtypes, and arrays
placed with ``NamedSharding`` over the job's mesh (an uncommitted argument changes the program).

    warmup --topology v5e:4x8 --cache-dir DIR --entrypoint bench.tpu_model:warm     # any CPU machine with libtpu
    python bench/tpu_model.py --cache-dir DIR --out result.json                      # on the slice (or one chip)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

LAYERS, D_MODEL, HEADS, D_FF, VOCAB, SEQ, PER_DEVICE_BATCH = 6, 512, 8, 2048, 8192, 256, 8


def shapes(devices: int) -> dict[str, tuple[int, ...]]:
    """Parameter and batch shapes for a job over ``devices`` devices."""
    out: dict[str, tuple[int, ...]] = {"embed": (VOCAB, D_MODEL), "unembed": (D_MODEL, VOCAB)}
    for i in range(LAYERS):
        out |= {f"l{i}_qkv": (D_MODEL, 3 * D_MODEL), f"l{i}_o": (D_MODEL, D_MODEL), f"l{i}_up": (D_MODEL, D_FF),
                f"l{i}_down": (D_FF, D_MODEL), f"l{i}_ln1": (D_MODEL,), f"l{i}_ln2": (D_MODEL,)}
    out["tokens"] = (PER_DEVICE_BATCH * devices, SEQ)
    return out


def build(mesh: Any) -> tuple[Any, dict[str, Any], Any]:
    """``(step, param_shardings, batch_sharding)``: the jitted train step and where its inputs live."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    def norm(x: Any, g: Any) -> Any:
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g

    def loss_fn(params: dict[str, Any], tokens: Any) -> Any:
        x = params["embed"][tokens[:, :-1]].astype(jnp.bfloat16)
        b, t, _ = x.shape
        mask = jnp.tril(jnp.ones((t, t), bool))
        for i in range(LAYERS):
            h = norm(x, params[f"l{i}_ln1"])
            q, k, v = jnp.split(h @ params[f"l{i}_qkv"].astype(jnp.bfloat16), 3, axis=-1)
            q, k, v = (a.reshape(b, t, HEADS, D_MODEL // HEADS) for a in (q, k, v))
            att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(D_MODEL // HEADS).astype(jnp.bfloat16)
            att = jax.nn.softmax(jnp.where(mask, att.astype(jnp.float32), -1e9), axis=-1).astype(jnp.bfloat16)
            x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, D_MODEL) @ params[f"l{i}_o"].astype(
                jnp.bfloat16)
            h = norm(x, params[f"l{i}_ln2"])
            x = x + jax.nn.gelu(h @ params[f"l{i}_up"].astype(jnp.bfloat16)) @ params[f"l{i}_down"].astype(
                jnp.bfloat16)
        logits = (x @ params["unembed"].astype(jnp.bfloat16)).astype(jnp.float32)
        labels = jax.nn.one_hot(tokens[:, 1:], VOCAB)
        return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))

    def step(params: dict[str, Any], tokens: Any) -> tuple[dict[str, Any], Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads), loss

    replicated = NamedSharding(mesh, PartitionSpec())
    by_batch = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    param_shardings = {name: replicated for name in shapes(1) if name != "tokens"}
    jitted = jax.jit(step, in_shardings=(param_shardings, by_batch), out_shardings=(param_shardings, replicated),
                     donate_argnums=(0,))
    return jitted, param_shardings, by_batch


def warm(ctx: Any) -> None:
    """Warm-up entrypoint: compile the train step for the target slice, with abstract inputs only."""
    mesh = ctx.mesh(("data",))
    step, param_shardings, _ = build(mesh)
    s = shapes(ctx.global_devices)
    params = {n: ctx.abstract(s[n], "float32", mesh=mesh) for n in param_shardings}
    tokens = ctx.abstract(s["tokens"], "int32", ("data",), mesh)
    step.lower(params, tokens).compile()


def main(argv: list[str] | None = None) -> int:
    """Run three steps on this host's devices through ``enable_cache()``; print and write what happened."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--job", default="tpu-check")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    started = time.perf_counter()
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from jaxcache.client import enable_cache

    session = enable_cache(args.cache_dir, job=args.job, local_dir="off")
    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    step, param_shardings, by_batch = build(mesh)
    s = shapes(jax.device_count())
    rng = np.random.default_rng(0)
    params = {n: jax.device_put((rng.standard_normal(s[n]) * 0.02).astype(np.float32), param_shardings[n])
              for n in param_shardings}
    tokens = jax.device_put(rng.integers(0, VOCAB, s["tokens"]).astype(np.int32), by_batch)
    ready = time.perf_counter()
    params, loss = step(params, tokens)
    first = float(loss)
    first_done = time.perf_counter()
    losses = [first]
    for _ in range(2):
        params, loss = step(params, tokens)
        losses.append(float(loss))
    stats = session.stats()
    result = {"device_kind": jax.devices()[0].device_kind, "devices": jax.device_count(),
              "start_to_ready_s": round(ready - started, 3), "first_step_s": round(first_done - ready, 3),
              "start_to_first_step_s": round(first_done - started, 3), "losses": losses,
              "hits": stats.hits, "misses": stats.misses, "writes": getattr(stats, "writes", None),
              "summary": session.summary()}
    print(json.dumps(result), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
