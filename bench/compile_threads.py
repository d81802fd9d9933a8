"""Does ``lower().compile()`` overlap across threads? One process compiles N distinct programs of the example (or
``--model decoder``) one after another, then N new ones in a thread pool, rounds alternating, on the CPU or a
compile-only TPU slice: lower+compile, and XLA's compile alone on programs lowered before. Prints one JSON line:
wall and CPU seconds an arm, serial / threaded wall, and the cores each arm used (CPU seconds a wall second: higher
for the pool only where its threads really run at once, on a shared machine too). No persistent cache.

    python bench/compile_threads.py --platform cpu
    .venv-tpu/bin/python bench/compile_threads.py --platform tpu --topology v5e:2x2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def devices(platform: str, topology: str) -> list[Any]:
    import jax

    if platform == "cpu":
        jax.config.update("jax_num_cpu_devices", 4)
        return list(jax.devices())
    from jaxcache.topology import parse_tpu_slice
    from jaxcache.warmup import tpu

    return tpu.slice_devices(parse_tpu_slice(topology), attached=False)


def lower_one(model: str, mesh: Any, batch: int) -> Any:
    """The model's train step for ``batch`` examples a device, lowered (traced and turned into StableHLO)."""
    import jax

    if model == "decoder":
        from bench import tpu_model

        step, shardings, by_batch = tpu_model.build(mesh)
        s = tpu_model.shapes(mesh.devices.size * batch)  # batch x the decoder's own batch a device
        params = {n: jax.ShapeDtypeStruct(s[n], "float32", sharding=shardings[n]) for n in shardings}
        return step.lower(params, jax.ShapeDtypeStruct(s["tokens"], "int32", sharding=by_batch))
    from jaxcache.warmup import examples

    step, params_sharding, by_batch = examples.train_step(mesh)
    s = examples.shapes(mesh.devices.size, batch)
    params = {n: jax.ShapeDtypeStruct(s[n], "float32", sharding=params_sharding[n]) for n in params_sharding}
    x = jax.ShapeDtypeStruct(s["x"], "float32", sharding=by_batch)
    y = jax.ShapeDtypeStruct(s["y"], "float32", sharding=by_batch)
    return step.lower(params, x, y)


def timed(work: Any, todo: list[Any], threads: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``work`` over ``todo``: one after another (``threads`` 1) or in a thread pool."""
    started, times = time.perf_counter(), os.times()
    if threads == 1:
        for item in todo:
            work(item)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, todo))
    after = os.times()
    return time.perf_counter() - started, after.user + after.system - times.user - times.system


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--platform", choices=("cpu", "tpu"), default="cpu")
    p.add_argument("--topology", default="v5e:2x2", help="TPU: the slice compiled for (compile-only)")
    p.add_argument("--programs", type=int, default=8, help="distinct programs a round")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="rounds of each arm, alternating")
    p.add_argument("--model", choices=("example", "decoder"), default="example")
    p.add_argument("--layers", type=int, default=1, help="decoder: its layers (bench/tpu_model.py has 6)")
    args = p.parse_args()
    if args.model == "decoder":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from bench import tpu_model

        tpu_model.LAYERS = args.layers
    if args.platform == "tpu":
        from jaxcache.warmup import tpu

        tpu.keep_off_metadata_server()
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"
    import numpy as np
    from jax.sharding import Mesh

    mesh = Mesh(np.asarray(devices(args.platform, args.topology)), ("data",))
    lower_one(args.model, mesh, 1).compile()  # JAX's and XLA's one-time start-up, in no arm
    batches = iter(range(2, 10**6))  # every program of the run distinct: no in-memory cache answers
    # "lower+compile": what a warm-up's thread would do; "compile": XLA's part alone, on programs lowered before.
    arms = {(what, n): {"wall": [], "cpu": []} for what in ("lower+compile", "compile") for n in (1, args.threads)}
    loads = []
    for _ in range(args.rounds):
        for (what, threads), got in arms.items():
            todo = [next(batches) for _ in range(args.programs)]
            if what == "compile":
                lowered = [lower_one(args.model, mesh, b) for b in todo]
                wall, cpu = timed(lambda low: low.compile(), lowered, threads)
            else:
                wall, cpu = timed(lambda b: lower_one(args.model, mesh, b).compile(), todo, threads)
            got["wall"].append(round(wall, 3))
            got["cpu"].append(round(cpu, 3))
            loads.append(os.getloadavg()[0])
    result: dict[str, Any] = {
        "platform": args.platform, "topology": args.topology if args.platform == "tpu" else "1x1x4",
        "model": args.model + (f" ({args.layers} layers)" if args.model == "decoder" else ""),
        "programs": args.programs, "threads": args.threads, "cpus": len(os.sched_getaffinity(0)),
        "load_average": round(statistics.mean(loads), 2)}
    for what in ("lower+compile", "compile"):
        serial, threaded = arms[(what, 1)], arms[(what, args.threads)]
        s, t = statistics.median(serial["wall"]), statistics.median(threaded["wall"])
        result[what] = {
            "serial_wall_s": serial["wall"], "threaded_wall_s": threaded["wall"],
            "serial_cpu_s": serial["cpu"], "threaded_cpu_s": threaded["cpu"],
            "serial_over_threaded": round(s / t, 3),
            # CPU seconds a wall second: above the serial arm's only if the threads ran at the same time.
            "cores_used_serial": round(sum(serial["cpu"]) / sum(serial["wall"]), 2),
            "cores_used_threaded": round(sum(threaded["cpu"]) / sum(threaded["wall"]), 2)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
