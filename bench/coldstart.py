"""Cold start of a real train step with ``jaxcache.client``: no cache, a cold cache and a warm one.

What it measures, each sample in a fresh interpreter started by this script (``sys.executable``):

* ``nocache``: plain JAX, no persistent cache: the process compiles everything;
* ``cold``: ``enable_cache(<new empty dir>, min_compile_time_secs=0, min_entry_size_bytes=-1)``, so every program
  is compiled *and written* (JAX's default threshold, 1 s, would skip the small init program);
* ``warm``: ``enable_cache()`` on the directory the first ``cold`` run filled: every program is loaded; the worker
  asserts the session counted 100% hits and no misses, and fails loudly otherwise.

The program is a small decoder-only transformer (token + position embedding, ``--layers`` pre-norm blocks of
layernorm, causal multi-head attention and a GELU MLP, a tied output layer, softmax cross-entropy) trained with
AdamW written in ``jax.numpy``; init and the whole train step are each one ``jax.jit``. Compiling it takes seconds
on a CPU; a step takes milliseconds.

Reported, as medians of ``--repeat`` runs that alternate between the modes: time to first step (from the moment
the parent launches the process to the end of the first step's ``block_until_ready``), process wall time
(launch to exit, measured by the parent; the process takes ``--steps`` more steps after the first), the
cold/warm and nocache/warm ratios, and ``enable_cache()`` wall time in the cold and warm processes.

Then the steady state: ``--steady-steps`` steps (after the first, untimed) in fresh processes, in rounds of three
in a rotating order: without the client, with it, and without it again. All load *the same compiled program*
from the warm directory, so the only difference is the client: ``without`` configures JAX by hand with the
settings the client would use (and is checked to have written nothing, i.e. to have hit); ``with`` calls
``enable_cache()``. The with/without ratio of the loop medians must read 1.00 within noise, and the noise is
measured, not guessed: the second ``without`` arm gives the without/without (A/A) ratio of the same run. Every
worker also counts ``jax.monitoring`` events and JAX cache-logger records during its loop: the client's only
hooks into JAX.

Last, ``import jaxcache.client`` on top of ``import jax``, in fresh processes (the issue's target: <= 50 ms).

Machines are noisy: every figure that matters is a median or a ratio within this one run; nothing asserts a
timing. The page cache cannot be dropped without root, so warm runs read entries from memory, as a job on a
machine that just ran the warm-up would.

    .venv/bin/python bench/coldstart.py             # table; figures also in bench/out/coldstart.json
    .venv/bin/python bench/coldstart.py --quick     # fewer runs and steps, about three minutes
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_MODES = ("nocache", "cold", "warm")
_STEADY_ARMS = ("without", "with", "without-again")
_IMPORT_TARGET_MS = 50.0
# Environment that would change what a worker does: cleared so every worker starts from the same place.
_CLEARED_ENV = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "JAX_ENABLE_COMPILATION_CACHE")


# --------------------------------------------------------------------------------------------------------------
# The model: what runs in the workers. jax is imported inside the functions, so the parent never loads it.


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


_JAX_CACHE_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache", "jax._src.dispatch")


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


# --------------------------------------------------------------------------------------------------------------
# The parent: launches workers, never imports jax.


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV and not k.startswith("JAXCACHE_")}
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS") or "cpu"
    return env


def launch(args: list[str], timeout: float = 600) -> dict:
    """Run a worker; return its JSON plus ``wall_s`` (launch to exit, measured here)."""
    launched = time.time()
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, *args, "--launched", repr(launched)], capture_output=True,
                          text=True, env=_env(), timeout=timeout)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"worker {' '.join(args)} failed with exit code {proc.returncode}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = wall
    return out


def entries(cache_dir: str) -> dict[str, int]:
    """The cache's entry files and their mtimes (run records under .jaxcache/ are not entries)."""
    with os.scandir(cache_dir) as it:
        return {e.name: e.stat().st_mtime_ns for e in it if e.is_file()}


def _shape_args(args: argparse.Namespace) -> list[str]:
    return ["--layers", str(args.layers), "--d-model", str(args.d_model), "--heads", str(args.heads),
            "--seq", str(args.seq), "--batch", str(args.batch), "--vocab", str(args.vocab)]


def measure(args: argparse.Namespace, work: str) -> dict:
    shape = _shape_args(args)
    warm_dir = os.path.join(work, "cache-0")
    order = list(_MODES[1:] + _MODES[:1])  # cold, warm, nocache: the first cold run fills the warm directory
    coldstart: dict[str, list[dict]] = {m: [] for m in _MODES}
    for r in range(args.repeat):
        for mode in order[r % 3:] + order[: r % 3]:  # rotated, so no mode always runs first
            cache_dir = warm_dir if mode == "warm" or (mode == "cold" and r == 0) else os.path.join(work, f"cache-{r}")
            if mode == "cold" and r and os.path.exists(cache_dir):
                raise SystemExit(f"{cache_dir} exists: a cold run needs a new directory")
            got = launch(["--worker", mode, cache_dir, "--steps", str(args.steps), *shape])
            coldstart[mode].append(got)
            print(f"  coldstart run {r + 1}/{args.repeat} {mode:8s} first step {got['first_step_s']:6.2f} s, "
                  f"wall {got['wall_s']:6.2f} s", file=sys.stderr)
    written = entries(warm_dir)

    # Three arms per round, in a rotating order: without the client, with it, and without it again. The second
    # "without" is the yardstick: what two runs of the very same thing differ by on this machine right now.
    steady: dict[str, list[dict]] = {arm: [] for arm in _STEADY_ARMS}
    for r in range(args.steady_repeat):
        for arm in _STEADY_ARMS[r % 3:] + _STEADY_ARMS[: r % 3]:
            mode = "with" if arm == "with" else "without"
            got = launch(["--worker", mode, warm_dir, "--steps", str(args.steady_steps), *shape])
            if entries(warm_dir) != written:
                raise SystemExit(f"the {arm!r} steady-state process wrote to the warm cache: it missed, so it did not"
                                 " run the same compiled program (do its JAX settings match the client's?)")
            steady[arm].append(got)
            print(f"  steady run {r + 1}/{args.steady_repeat} {arm:13s} {args.steady_steps} steps "
                  f"{got['loop_s']:6.2f} s", file=sys.stderr)

    imports = [launch(["--import-worker"]) for _ in range(args.import_repeat)]
    return {"coldstart": coldstart, "steady": steady, "imports": imports, "entries": len(written),
            "entry_bytes": sum(os.path.getsize(os.path.join(warm_dir, n)) for n in written)}


def report(runs: dict, args: argparse.Namespace) -> dict:
    med = statistics.median
    cs = runs["coldstart"]
    first = {m: med(r["first_step_s"] for r in cs[m]) for m in _MODES}
    wall = {m: med(r["wall_s"] for r in cs[m]) for m in _MODES}
    losses = {round(r["first_loss"], 5) for m in _MODES for r in cs[m]}
    if len(losses) != 1:
        raise SystemExit(f"the modes disagree on the first step's loss: {sorted(losses)}")
    stats = {m: [r["stats"] for r in cs[m]] for m in ("cold", "warm")}
    odd = []
    for r in cs["cold"]:
        s = r["stats"]
        if s["hits"] or not s["misses"] or s["writes"] != s["misses"]:
            odd.append(f"a cold run's stats: {r['summary']}")

    st = runs["steady"]
    loop = {m: med(r["loop_s"] for r in st[m]) for m in st}
    best = {m: med(r["step_s_best_chunk"] for r in st[m]) for m in st}

    def per_round(arm: str, key: str) -> list[float]:
        return [a[key] / b[key] for a, b in zip(st[arm], st["without"], strict=True)]

    loop_events = {m: sum(r["loop_events"] + r["loop_log_records"] for r in st[m]) for m in st}
    if any(loop_events.values()):
        odd.append(f"jax.monitoring events or JAX cache log records during the step loops: {loop_events}")
    if len({r["last_loss"] for m in st for r in st[m]}) != 1:
        odd.append("steady state: the processes with and without the client ended on different losses")

    imp = runs["imports"]
    foreign = sorted({p for r in imp for p in r["foreign_packages"]})
    if foreign:
        odd.append(f"import jaxcache.client pulls in packages beyond jax, zstandard and the stdlib: {foreign}")

    def ms(x: float) -> float:
        return round(1000 * x, 1)

    return {
        "shape": {k: getattr(args, k) for k in ("layers", "d_model", "heads", "seq", "batch", "vocab")},
        "repeat": args.repeat,
        "steps_after_first": args.steps,
        "entries_written": runs["entries"],
        "entry_bytes": runs["entry_bytes"],
        "first_step_s": {m: round(first[m], 3) for m in _MODES},
        "wall_s": {m: round(wall[m], 3) for m in _MODES},
        "first_step_cold_vs_warm": round(first["cold"] / first["warm"], 2),
        "first_step_nocache_vs_warm": round(first["nocache"] / first["warm"], 2),
        "first_step_cold_vs_nocache": round(first["cold"] / first["nocache"], 2),
        "wall_cold_vs_warm": round(wall["cold"] / wall["warm"], 2),
        "wall_nocache_vs_warm": round(wall["nocache"] / wall["warm"], 2),
        "enable_cache_ms": {m: ms(med(r["enable_cache_s"] for r in cs[m])) for m in ("cold", "warm")},
        "import_jax_ms": {m: ms(med(r["import_jax_s"] for r in cs[m])) for m in _MODES},
        "stats": {m: {k: med(s[k] for s in stats[m]) for k in stats[m][0] if stats[m][0][k] is not None}
                  for m in stats},
        "steady": {
            "steps": args.steady_steps,
            "repeat": args.steady_repeat,
            "loop_s": {m: round(loop[m], 3) for m in loop},
            "step_ms": {m: round(1000 * loop[m] / args.steady_steps, 3) for m in loop},
            "with_vs_without": round(loop["with"] / loop["without"], 3),
            "again_vs_without": round(loop["without-again"] / loop["without"], 3),
            "with_vs_without_per_round": [round(x, 3) for x in per_round("with", "loop_s")],
            "again_vs_without_per_round": [round(x, 3) for x in per_round("without-again", "loop_s")],
            "best_chunk_step_ms": {m: round(1000 * best[m], 3) for m in best},
            "with_vs_without_best_chunk": round(best["with"] / best["without"], 3),
            "again_vs_without_best_chunk": round(best["without-again"] / best["without"], 3),
            "events_and_log_records_in_loops": loop_events,
            "first_step_s": {m: round(med(r["first_step_s"] for r in st[m]), 3) for m in st},
        },
        "imports": {
            "repeat": args.import_repeat,
            "import_jax_ms": ms(med(r["import_jax_s"] for r in imp)),
            "import_client_ms": ms(med(r["import_client_s"] for r in imp)),
            "import_client_ms_runs": [ms(r["import_client_s"]) for r in imp],
            "import_client_vs_jax": round(med(r["import_client_s"] / r["import_jax_s"] for r in imp), 3),
            "new_modules": med(r["new_modules"] for r in imp),
            "target_ms": _IMPORT_TARGET_MS,
        },
        "first_loss": cs["nocache"][0]["first_loss"],
        "odd": odd,
        "runs": runs,
    }


def _print_rows(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def print_table(fig: dict) -> None:
    rows = [("mode", "first step s", "vs warm", "process wall s", "vs warm", "enable_cache() ms", "import jax ms")]
    for m in _MODES:
        rows.append((
            m, f"{fig['first_step_s'][m]:.2f}", f"{fig['first_step_s'][m] / fig['first_step_s']['warm']:.2f}x",
            f"{fig['wall_s'][m]:.2f}", f"{fig['wall_s'][m] / fig['wall_s']['warm']:.2f}x",
            f"{fig['enable_cache_ms'][m]:.1f}" if m in fig["enable_cache_ms"] else "-",
            f"{fig['import_jax_ms'][m]:.0f}",
        ))
    _print_rows(rows)
    sh = fig["shape"]
    print(f"\nmedians of {fig['repeat']} runs per mode, each a fresh process (launch -> first step done; "
          f"wall: launch -> exit after {fig['steps_after_first']} more steps)")
    print(f"model: {sh['layers']} blocks, d_model {sh['d_model']}, {sh['heads']} heads, seq {sh['seq']}, "
          f"batch {sh['batch']}, vocab {sh['vocab']}; {fig['entries_written']} cache entries, "
          f"{fig['entry_bytes'] / 1024:.0f} KiB; first-step loss {fig['first_loss']:.4f} in every mode")
    print(f"time to first step, cold/warm: {fig['first_step_cold_vs_warm']:.2f}x   nocache/warm: "
          f"{fig['first_step_nocache_vs_warm']:.2f}x   cold/nocache: {fig['first_step_cold_vs_nocache']:.2f}x")
    print(f"process wall, cold/warm: {fig['wall_cold_vs_warm']:.2f}x   "
          f"nocache/warm: {fig['wall_nocache_vs_warm']:.2f}x")
    for m, s in fig["stats"].items():
        print(f"session stats ({m}, medians): {s.get('hits', 0):g} hits, {s.get('misses', 0):g} misses, "
              f"{s.get('writes', 0):g} writes, compile {s.get('compile_s', 0):.2f} s, retrieval "
              f"{s.get('retrieval_s', 0):.3f} s, saved {s.get('saved_s', 0):.2f} s")
    sd = fig["steady"]

    def span(xs: list[float]) -> str:
        return f"{min(xs):.3f}..{max(xs):.3f}"

    print(f"\nsteady state: {sd['steps']} steps after the first, medians of {sd['repeat']} rounds of fresh processes "
          "(same compiled program, loaded from the warm cache)")
    rows = [("arm", "loop s", "ms/step", "vs without", "per round", "fastest chunk ms/step", "vs without")]
    for arm, key in (("without", None), ("with", "with_vs_without"), ("without-again", "again_vs_without")):
        rows.append((
            arm if arm != "without-again" else "without again (A/A)", f"{sd['loop_s'][arm]:.3f}",
            f"{sd['step_ms'][arm]:.2f}", f"{sd[key]:.3f}" if key else "1",
            span(sd[f"{key}_per_round"]) if key else "-", f"{sd['best_chunk_step_ms'][arm]:.2f}",
            f"{sd[key + '_best_chunk']:.3f}" if key else "1",
        ))
    _print_rows(rows)
    print(f"with/without client: {sd['with_vs_without']:.3f}; the noise yardstick, without/without (A/A): "
          f"{sd['again_vs_without']:.3f}")
    ev = sd["events_and_log_records_in_loops"]
    print("jax.monitoring events + JAX cache log records during the timed loops: "
          + ", ".join(f"{k} {v}" for k, v in ev.items()) + " (what the client's listeners and log tap could run on)")
    im = fig["imports"]
    print(f"\nimport jaxcache.client on top of import jax: {im['import_client_ms']:.1f} ms median of {im['repeat']} "
          f"(target <= {im['target_ms']:.0f} ms), {im['import_client_vs_jax']:.1%} of import jax "
          f"({im['import_jax_ms']:.0f} ms here: both scale with the machine's load)")
    for line in fig["odd"]:
        print(f"ODD: {line}")


def _source_version() -> str | None:
    """The commit measured, with ``+dirty`` when the client or core has uncommitted changes (None outside git)."""
    root = os.path.dirname(_HERE)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "client", "core"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _client_changed(before: str | None, after: str | None) -> bool:
    if before is None or after is None or before.endswith("+dirty") or after.endswith("+dirty"):
        return True
    diff = subprocess.run(["git", "diff", "--quiet", before, after, "--", "client", "core"],
                          cwd=os.path.dirname(_HERE), capture_output=True)
    return diff.returncode != 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/coldstart.py",
        description="Time to first train step and process wall time of a small transformer with no persistent "
        "cache, a cold and a warm jaxcache cache (fresh processes, medians, ratios within one run); "
        "enable_cache() and import cost; steady-state step time with and without the client.",
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per cold-start mode (default 5)")
    parser.add_argument("--steps", type=int, default=10, help="steps after the first in cold-start runs (default 10)")
    parser.add_argument("--steady-steps", type=int, default=1000, help="timed steps in steady state (default 1000)")
    parser.add_argument("--steady-repeat", type=int, default=5,
                        help="steady-state rounds: each runs without the client, with it, without again (default 5)")
    parser.add_argument("--import-repeat", type=int, default=7, help="import timing runs (default 7)")
    parser.add_argument("--quick", action="store_true",
                        help="3 cold-start runs, 3x300 steady steps, 5 import runs (a smoke run; ratios are noisier)")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    parser.add_argument("--d-model", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--seq", type=int, default=32, help="sequence length (default 32)")
    parser.add_argument("--batch", type=int, default=4, help="batch size (default 4)")
    parser.add_argument("--vocab", type=int, default=256, help="vocabulary (default 256)")
    parser.add_argument("--out", default=os.path.join(_HERE, "out", "coldstart.json"),
                        help="where to write the figures as JSON (default bench/out/coldstart.json)")
    parser.add_argument("--workdir", metavar="DIR", help="where to put the cache dirs (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the cache dirs instead of removing them")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "CACHE_DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--import-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.import_worker:
        print(json.dumps(import_worker()))
        return 0
    if args.worker:
        shape = {k: getattr(args, k) for k in ("layers", "d_model", "heads", "seq", "batch", "vocab")}
        print(json.dumps(worker(*args.worker, launched=args.launched, steps=args.steps, shape=shape)))
        return 0
    if args.quick:
        args.repeat, args.steady_steps, args.steady_repeat, args.import_repeat = 3, 300, 3, 5
    if args.repeat < 1 or args.steady_repeat < 1 or args.import_repeat < 1 or args.steady_steps < 1:
        parser.error("--repeat, --steady-repeat, --import-repeat and --steady-steps must be at least 1")
    if args.d_model % args.heads:
        parser.error("--d-model must be a multiple of --heads")

    began = time.perf_counter()
    source_before = _source_version()
    if args.workdir:
        work = os.path.abspath(args.workdir)
        os.makedirs(work, mode=0o700, exist_ok=True)
        if os.listdir(work):
            sys.exit(f"error: {work} is not empty")
    else:
        work = tempfile.mkdtemp(prefix="jaxcache-bench-coldstart-")
    try:
        runs = measure(args, work)
    finally:
        print(f"finished in {time.perf_counter() - began:.0f}s", file=sys.stderr)
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    fig = report(runs, args)
    fig["command"] = " ".join([os.path.relpath(sys.executable), *sys.argv])
    source_after = _source_version()
    fig["source"] = source_before if source_before == source_after else f"{source_before} -> {source_after}"
    if source_before != source_after and _client_changed(source_before, source_after):
        fig["odd"].append(f"the client or core changed during the run ({fig['source']}): measure again")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(fig, f, indent=1)
    if args.json:
        print(json.dumps({k: v for k, v in fig.items() if k != "runs"}, indent=1))
    else:
        print_table(fig)
        print(f"\nmeasured at {fig['source'] or 'an unknown commit'}; figures and every run: "
              f"{os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
