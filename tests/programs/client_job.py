"""A training-script stand-in that uses jaxcache.client: tests run it in fresh processes.

Prints one JSON line on stdout: the session's stats, summary, fingerprint and run record as written at exit
(read back from storage by the test). Exit 3 with ``ERROR <type>: <message>`` when enable_cache refuses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir")
    parser.add_argument("--job")
    parser.add_argument("--trust", default="strict")
    parser.add_argument("--service-url")
    parser.add_argument("--token")
    parser.add_argument("--xla-caches")
    parser.add_argument("--max-size-bytes", type=int)
    parser.add_argument("--default-thresholds", action="store_true", help="keep JAX's write thresholds")
    parser.add_argument("--compile-first", action="store_true", help="compile something before enable_cache")
    parser.add_argument("--twice", choices=["same", "other"], help="call enable_cache a second time")
    parser.add_argument("--distributed", nargs=3, metavar=("COORDINATOR", "NUM", "ID"))
    parser.add_argument("--programs", default="affine,gram,wave,grad")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to wait after compiling")
    parser.add_argument("--startup-s", type=float, default=0.0,
                        help="seconds between enable_cache and the first compile (a job's model init)")
    parser.add_argument("--verify", choices=["off", "sample", "attested", "signed"])
    parser.add_argument("--local-dir", help="the node-local tier's directory (off: none)")
    parser.add_argument("--print-record", action="store_true", help="also print the run record as sent to a service")
    parser.add_argument("--settle", action="store_true",
                        help="report once the client has read back every entry written (as it does at exit)")
    parser.add_argument("--watch-xla-caches", action="store_true",
                        help="report where JAX told XLA to keep its own sub-caches (its DEBUG log of each)")
    parser.add_argument("--relink", nargs=2, metavar=("LINK", "TARGET"),
                        help="once enable_cache returned, point the symbolic link LINK at TARGET, keeping its owner"
                             " (another local user swapping a link after the client checked it)")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import numpy as np

    xla_cache_paths: list[str] = []
    if args.watch_xla_caches:
        import logging

        class Watch(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if str(record.msg).startswith("Enabling XLA"):  # "Enabling XLA autotuning cache at '%s'", ...
                    xla_cache_paths.append(record.getMessage())

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
        logging.getLogger("jaxcache.client").setLevel(logging.INFO)  # the client's notices about them
        compiler_log = logging.getLogger("jax._src.compiler")
        compiler_log.setLevel(logging.DEBUG)
        compiler_log.addHandler(Watch(logging.DEBUG))

    if args.compile_first:
        jax.jit(lambda x: x + 1)(np.float32(1))

    from jaxcache.client import enable_cache
    from jaxcache.errors import JaxcacheError

    kwargs = dict(job=args.job, trust=args.trust, service_url=args.service_url, token=args.token,
                  xla_caches=args.xla_caches, max_size_bytes=args.max_size_bytes, verify=args.verify,
                  local_dir=args.local_dir)
    if not args.default_thresholds:
        kwargs.update(min_compile_time_secs=0, min_entry_size_bytes=-1)
    try:
        session = enable_cache(args.cache_dir, **kwargs)
        if args.twice == "same":
            again = enable_cache(args.cache_dir, **kwargs)
            assert again is session, "a second call with the same settings must return the same session"
        elif args.twice == "other":
            enable_cache(args.cache_dir, **{**kwargs, "job": "another-job"})
    except JaxcacheError as exc:
        print(f"ERROR {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3

    if args.relink:
        link, target = args.relink
        owner = os.lstat(link)
        os.symlink(target, link + ".swap")
        os.lchown(link + ".swap", owner.st_uid, owner.st_gid)
        os.replace(link + ".swap", link)
    if args.startup_s:
        time.sleep(args.startup_s)
    if args.distributed:
        coordinator, num, pid = args.distributed
        jax.distributed.initialize(coordinator, num_processes=int(num), process_id=int(pid))

    import jax.numpy as jnp

    x = np.arange(8, dtype=np.float32)
    m = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    w = np.ones((4, 2), dtype=np.float32)
    # Named functions: each program's module name (jit_affine, ...) differs, as in real jobs.
    def affine(v):
        return v * 2.0 + 1.0

    def gram(a):
        return a @ a.T

    def wave(v):
        return jnp.sin(v) ** 2 + jnp.cos(v) ** 2

    def loss(a, b):
        return jnp.sum((b @ a) ** 2)

    noise = np.random.default_rng(0).random(250_000).astype(np.float32)

    def big(v):  # a constant of 1 MB that compresses badly: an entry of about 900 KB, many zstd blocks
        return v + noise

    programs = {
        "affine": (lambda: jax.jit(affine)(x), x * 2 + 1),
        "gram": (lambda: jax.jit(gram)(m), m @ m.T),
        "wave": (lambda: jax.jit(wave)(x), np.ones_like(x)),
        "grad": (lambda: jax.jit(jax.grad(loss))(w, m), 2 * m.T @ (m @ w)),
        "big": (lambda: jax.jit(big)(np.zeros_like(noise)), noise),
    }
    for name in args.programs.split(","):
        run, want = programs[name]
        got = np.asarray(run())
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            print(f"{name}: got {got!r}, want {want!r}", file=sys.stderr)
            return 1
    if args.sleep:
        time.sleep(args.sleep)

    if args.settle:
        session.wait_for_attestations()
    findings = [{"key": v.key, "class": v.classification} for v in session.check_sample()]
    stats = session.stats()
    record = session.flush()
    print(json.dumps({
        "stats": {**{k: getattr(stats, k) for k in stats.__slots__}, "hit_rate": stats.hit_rate},
        "summary": session.summary(),
        "fingerprint": record.fingerprint.as_dict(),
        "record_name": record.name,
        "cache_dir": session.cache_dir,
        "process_index": record.process_index,
        "integrity_findings": findings,
        "skipped": session.skipped(),
        "local_dir": session.local_dir,
        "local": None if record.local is None else json.loads(record.to_json())["local"],
        "xla_caches": jax.config.jax_persistent_cache_enable_xla_caches,
        "xla_cache_paths": xla_cache_paths,
        **({"record": json.loads(record.to_json())} if args.print_record else {}),
    }), flush=True)
    if args.distributed:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
