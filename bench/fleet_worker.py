"""The job bench/fleet_start.py starts, a fresh process per start: ``--programs`` small distinct jitted programs
(``fleet_s<salt>_p<i>``: the salt makes another set of keys, for cold starts), run once each, on a cache root
through jaxcache's node-local tier (``--arm tier``: ``enable_cache(root)``, the tier where ``JAXCACHE_LOCAL_DIR``
says) or through plain JAX (``--arm plain``: ``jax_compilation_cache_dir`` set to the root). Both arms store every
program (no compile-time or size threshold). Prints one JSON line of ``time.time()`` stamps and JAX's own counts of
cache hits and misses (``jax.monitoring`` events), so the two arms are counted alike; before it, a line
``program <i> <time.time()>`` as each program's result is in.

With ``--gate`` the job imports JAX and defines its programs, prints ``ready`` and waits for a line on stdin before
it starts its cache (a fleet's nodes all start at once, their imports done). With ``--watch`` it also notes when
the tier's directory first holds every program's entry (the working set seeded, as the file system shows it).
JAX is imported only here, never by the parent."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter

_EVENTS = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses",
           "/jax/compilation_cache/compile_requests_use_cache": "lookups"}


def module_prefix(salt: int) -> str:
    """The file names of salt ``salt``'s entries start with this (JAX names a jitted function's module jit_<name>)."""
    return f"jit_fleet_s{salt}_p"


def programs(count: int, salt: int):
    """``count`` jitted programs, distinct by index and salt (each bakes both into its constants), and their input
    (a NumPy array: nothing compiles but the programs)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def make(i: int):
        def prog(x):
            return (jnp.sin(x * (i + 1)) + salt).sum()

        prog.__name__ = prog.__qualname__ = f"fleet_s{salt}_p{i}"
        return jax.jit(prog)

    return [make(i) for i in range(count)], np.arange(64, dtype=np.float32)


def watch(directory: str, prefix: str, count: int, found: dict[str, float], stop: threading.Event) -> None:
    """Note in ``found["seeded_at"]`` when ``directory`` first holds ``count`` entries whose names start with
    ``prefix``."""
    while not stop.is_set():
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            names = []
        if sum(1 for n in names if n.startswith(prefix) and n.endswith("-cache")) >= count:
            found["seeded_at"] = time.time()
            return
        stop.wait(0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arm", choices=("tier", "plain"), required=True)
    parser.add_argument("--root", required=True, help="the cache root: s3://, gs:// or az://")
    parser.add_argument("--job", required=True, help="the job name in the tier's run records")
    parser.add_argument("--salt", type=int, default=0, help="another salt, another set of keys")
    parser.add_argument("--programs", type=int, default=5)
    parser.add_argument("--gate", action="store_true", help="print 'ready' once imported, start on a stdin line")
    parser.add_argument("--watch", action="store_true", help="note when the tier's directory holds every entry")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    from jax import monitoring

    counts: Counter[str] = Counter()

    def count(event: str, **_: object) -> None:
        if event in _EVENTS:
            counts[_EVENTS[event]] += 1

    monitoring.register_event_listener(count)
    if args.arm == "tier":
        from jaxcache.client import enable_cache
    progs, x = programs(args.programs, args.salt)
    out: dict = {"imported_at": time.time()}
    if args.gate:
        print("ready", flush=True)
        sys.stdin.readline()
    out["go_at"] = time.time()
    session = None
    if args.arm == "tier":
        session = enable_cache(args.root, job=args.job, min_compile_time_secs=0, min_entry_size_bytes=-1)
    else:
        jax.config.update("jax_compilation_cache_dir", args.root)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        # jax 0.10: else the cache path enters the keys (and XLA is handed a bucket's path it cannot write).
        jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    out["enabled_at"] = time.time()
    stop = threading.Event()
    watcher = None
    if args.watch and session is not None and session.local_dir is not None:
        watcher = threading.Thread(target=watch, daemon=True,
                                   args=(session.local_dir, module_prefix(args.salt), args.programs, out, stop))
        watcher.start()
    results = []
    for i, prog in enumerate(progs):
        results.append(float(jax.block_until_ready(prog(x))))
        print(f"program {i} {time.time()!r}", flush=True)  # how far a job got, should it be killed
        if i == 0:
            out["first_at"] = time.time()
    out["done_at"] = time.time()
    if watcher is not None:
        watcher.join(1.0)  # a tier that fetched the set has it now; one that compiled writes it behind
        stop.set()
    out.update(hits=counts["hits"], misses=counts["misses"], lookups=counts["lookups"],
               result=round(sum(results), 3))
    if session is not None:
        out["summary"] = session.summary()
        out["local_dir"] = session.local_dir
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
