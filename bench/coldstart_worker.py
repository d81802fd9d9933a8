"""The processes bench/coldstart.py starts: each trains a small transformer once (no cache, a cold or a warm
client cache, or the steady state with and without the client) or times ``import jaxcache.client``, and prints
its figures as one JSON line. JAX is imported only here, never by the parent."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import time


def build_model(layers: int, d_model: int, heads: int, seq: int, vocab: int):
    """Return ``(init, train_step)``, both ``jax.jit``-ed: a decoder-only transformer trained with AdamW."""
    import jax
    import jax.numpy as jnp

    d_ff = 4 * d_model
    head_dim = d_model // heads
    lr, b1, b2, eps, weight_decay = 3e-3, 0.9, 0.98, 1e-8, 0.01

    def init_params(key):
        # One normal draw for all weights, sliced: every jax.random call is a threefry program that takes XLA's
        # CPU backend a second or more to compile, which would make init, not the train step, the cold start.
        def ln():
            return {"scale": jnp.ones(d_model), "bias": jnp.zeros(d_model)}

        shapes = {"embed": ((vocab, d_model), 0.02), "pos": ((seq, d_model), 0.02)}
        for i in range(layers):
            shapes |= {(i, "qkv"): ((d_model, 3 * d_model), d_model ** -0.5),
                       (i, "out"): ((d_model, d_model), (2 * layers * d_model) ** -0.5),
                       (i, "w1"): ((d_model, d_ff), d_model ** -0.5),
                       (i, "w2"): ((d_ff, d_model), (2 * layers * d_ff) ** -0.5)}
        sizes = [math.prod(shape) for shape, _ in shapes.values()]
        flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
        w, at = {}, 0
        for (name, (shape, scale)), size in zip(shapes.items(), sizes, strict=True):
            w[name] = flat[at: at + size].reshape(shape) * scale
            at += size
        blocks = [{"ln1": ln(), "qkv": w[i, "qkv"], "out": w[i, "out"], "ln2": ln(), "w1": w[i, "w1"],
                   "b1": jnp.zeros(d_ff), "w2": w[i, "w2"], "b2": jnp.zeros(d_model)} for i in range(layers)]
        return {"embed": w["embed"], "pos": w["pos"], "ln_f": ln(), "blocks": blocks}

    def layernorm(p, x):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]

    def attention(p, x):
        batch, length, _ = x.shape
        q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
        q, k, v = (t.reshape(batch, length, heads, head_dim).transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = (q @ k.transpose(0, 1, 3, 2)) * head_dim ** -0.5
        causal = jnp.tril(jnp.ones((length, length), bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        y = jax.nn.softmax(scores, axis=-1) @ v
        return y.transpose(0, 2, 1, 3).reshape(batch, length, d_model) @ p["out"]

    def forward(params, tokens):
        x = params["embed"][tokens] + params["pos"][: tokens.shape[1]]
        for block in params["blocks"]:
            x = x + attention(block, layernorm(block["ln1"], x))
            h = jax.nn.gelu(layernorm(block["ln2"], x) @ block["w1"] + block["b1"])
            x = x + h @ block["w2"] + block["b2"]
        return layernorm(params["ln_f"], x) @ params["embed"].T

    def loss_fn(params, tokens):
        logits = forward(params, tokens[:, :-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        target = tokens[:, 1:]
        return -jnp.take_along_axis(logp, target[..., None], axis=-1).mean()

    def init():
        params = init_params(jax.random.key(0))
        zeros = jax.tree.map(jnp.zeros_like, params)
        return params, {"m": zeros, "v": zeros, "count": jnp.zeros((), jnp.int32)}

    def train_step(params, opt, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        count = opt["count"] + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
        c1 = 1 - b1 ** count.astype(jnp.float32)
        c2 = 1 - b2 ** count.astype(jnp.float32)

        def update(p, m, v):
            decay = weight_decay * p if p.ndim >= 2 else 0.0  # no decay on biases and layernorm
            return p - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + decay)

        params = jax.tree.map(update, params, m, v)
        return params, {"m": m, "v": v, "count": count}, loss

    return jax.jit(init), jax.jit(train_step, donate_argnums=(0, 1))


def batches(n: int, batch: int, seq: int, vocab: int):
    """``n`` fixed batches of a learnable sequence (a noisy counting pattern), as device arrays."""
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        start = rng.integers(0, vocab, size=(batch, 1))
        stride = rng.integers(1, 4, size=(batch, 1))
        tokens = (start + stride * np.arange(seq + 1)) % vocab
        noise = rng.random(tokens.shape) < 0.05
        tokens = np.where(noise, rng.integers(0, vocab, size=tokens.shape), tokens).astype(np.int32)
        out.append(jax.device_put(tokens))
    return out


def _jax_settings_like_the_client(cache_dir: str) -> dict[str, object]:
    """What ``enable_cache(cache_dir, min_compile_time_secs=0, min_entry_size_bytes=-1)`` sets, without the client.

    Kept by hand so the ``without`` process never imports jaxcache; the worker checks it computes the same keys
    (it must write nothing into the warm directory).
    """
    import jax

    version = tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in jax.__version__.split(".")[:3])
    settings: dict[str, object] = {
        "jax_compilation_cache_dir": cache_dir,
        "jax_persistent_cache_min_compile_time_secs": 0,
        "jax_persistent_cache_min_entry_size_bytes": -1,
    }
    if version < (0, 11):  # the client's default there (see jaxcache.client.jax_internals.default_xla_caches)
        settings["jax_persistent_cache_enable_xla_caches"] = "none"
    return settings


_JAX_CACHE_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache", "jax._src.dispatch", "jax._src.cache_key")


class _LogCounter(logging.Filter):
    def __init__(self, counts: dict[str, int]) -> None:
        super().__init__()
        self._counts = counts

    def filter(self, record: logging.LogRecord) -> bool:
        self._counts["log_records"] += 1
        return True


def worker(mode: str, cache_dir: str, launched: float, steps: int, shape: dict[str, int]) -> dict:
    """One sample, in a fresh process. ``launched``: the parent's ``time.time()`` just before it started us."""
    began = time.time()
    import jax

    jax_imported = time.time()
    session = None
    enable_s = None
    if mode in ("cold", "warm", "with"):
        from jaxcache.client import enable_cache

        t = time.perf_counter()
        session = enable_cache(cache_dir, job=f"bench-coldstart-{mode}", min_compile_time_secs=0,
                               min_entry_size_bytes=-1)
        enable_s = time.perf_counter() - t
    elif mode == "without":
        for name, value in _jax_settings_like_the_client(os.path.abspath(cache_dir)).items():
            jax.config.update(name, value)
    elif mode != "nocache":
        raise SystemExit(f"unknown mode {mode!r}")

    init, train_step = build_model(shape["layers"], shape["d_model"], shape["heads"], shape["seq"], shape["vocab"])
    data = batches(8, shape["batch"], shape["seq"], shape["vocab"])
    params, opt = init()
    jax.block_until_ready(params)
    init_done = time.time()
    params, opt, loss = train_step(params, opt, data[0])
    first_loss = float(loss.block_until_ready())
    first_step_at = time.time()

    # Anything the client (or JAX) runs per step would have to come through jax.monitoring or JAX's cache
    # loggers: count both over the loop, in every mode alike. Listeners fire only when JAX reports something.
    seen = {"events": 0, "log_records": 0}
    count_logs = _LogCounter(seen)

    def count_event(*_: object, **__: object) -> None:
        seen["events"] += 1

    from jax import monitoring

    monitoring.register_event_listener(count_event)
    monitoring.register_event_duration_secs_listener(count_event)
    for name in _JAX_CACHE_LOGGERS:
        logging.getLogger(name).addFilter(count_logs)

    # The loop in ten chunks, each ended by a sync. Another process taking a core for a second only adds time,
    # so each run's fastest chunk estimates its step time with that taken out; the total is what a job sees.
    chunk = max(1, steps // 10)
    ends = []
    loss = None
    t = time.perf_counter()
    for i in range(steps):
        params, opt, loss = train_step(params, opt, data[(i + 1) % len(data)])
        if (i + 1) % chunk == 0 or i + 1 == steps:
            loss.block_until_ready()
            ends.append((time.perf_counter(), (i + 1) % chunk or chunk))
    loop_s = time.perf_counter() - t
    last_loss = float(loss) if loss is not None else first_loss
    starts = [t] + [end for end, _ in ends[:-1]]
    per_step = [(end - start) / n for start, (end, n) in zip(starts, ends, strict=True)] if ends else []

    result = {
        "mode": mode,
        "interpreter_s": began - launched,
        "import_jax_s": jax_imported - began,
        "enable_cache_s": enable_s,
        "init_done_s": init_done - launched,
        "first_step_s": first_step_at - launched,
        "first_loss": first_loss,
        "steps": steps,
        "loop_s": loop_s,
        "step_s_median_chunk": statistics.median(per_step) if per_step else None,
        "step_s_best_chunk": min(per_step) if per_step else None,
        "loop_events": seen["events"],
        "loop_log_records": seen["log_records"],
        "last_loss": last_loss,
    }
    if session is not None:
        s = session.stats()
        result["stats"] = {k: getattr(s, k) for k in s.__slots__} | {"hit_rate": s.hit_rate}
        result["summary"] = session.summary()
        result["keys_with_parts"] = sum(u.parts is not None for u in session.record().keys)
        if mode in ("warm", "with") and not (s.hits > 0 and s.misses == 0 and s.hit_rate == 1.0):
            print(f"FAIL: a warm process must load every program from the cache; {session.summary()}",
                  file=sys.stderr)
            raise SystemExit(4)
    return result


def import_worker() -> dict:
    """``import jax``, then ``import jaxcache.client``, timed apart; and what the client pulled in beyond jax."""
    t0 = time.perf_counter()
    import jax  # noqa: F401

    t1 = time.perf_counter()
    before = set(sys.modules)
    import jaxcache.client  # noqa: F401

    t2 = time.perf_counter()
    new = {name.partition(".")[0] for name in set(sys.modules) - before}
    allowed = set(sys.stdlib_module_names) | {"jax", "jaxlib", "zstandard", "jaxcache", "_distutils_hack"}
    return {"import_jax_s": t1 - t0, "import_client_s": t2 - t1, "new_modules": len(set(sys.modules) - before),
            "foreign_packages": sorted(new - allowed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("nocache", "cold", "warm", "without", "with", "without-again", "import"))
    parser.add_argument("--cache-dir")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--launched", type=float)
    for name in ("layers", "d-model", "heads", "seq", "batch", "vocab"):
        parser.add_argument(f"--{name}", type=int)
    args = parser.parse_args(argv)
    if args.mode == "import":
        print(json.dumps(import_worker()))
        return 0
    shape = {k: getattr(args, k) for k in ("layers", "d_model", "heads", "seq", "batch", "vocab")}
    print(json.dumps(worker(args.mode, args.cache_dir, launched=args.launched, steps=args.steps, shape=shape)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
