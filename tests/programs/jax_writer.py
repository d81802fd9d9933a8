"""Write a real JAX cache and record ground truth from JAX itself.

Standalone on purpose (imports no jaxcache): it runs under other interpreters and JAX versions too.
Usage: python jax_writer.py CACHE_DIR MANIFEST_JSON [--no-zstd] [--lru]

The manifest holds, per file JAX wrote: the module name and key JAX logged ("Writing %s to persistent
compilation cache with key %r"), and the compile seconds and compression JAX's own decoder reports.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

#: Layers of the slow program whose compile time a fresh process measures (see _slow_layers).
CALIBRATION_LAYERS = 100
#: Seconds the slow program should take to compile: JAX stores whole seconds, so well over one.
SLOW_COMPILE_S = 2.0


def _step(jax, jnp):
    def train_step(params, x):
        def loss(p):
            h = x
            for i, w in enumerate(p):
                h = jnp.tanh(h @ w) + jnp.sin(h) * 0.1 if i % 2 else jax.nn.gelu(h @ w)
            return jnp.mean(h**2)

        grads = jax.grad(loss)(params)
        return [w - 0.1 * g for w, g in zip(params, grads, strict=True)]

    return train_step


def _calibrate(layers: int) -> float:
    """Seconds this machine takes to compile the slow program with ``layers`` layers (no cache involved)."""
    import time

    import jax
    import jax.numpy as jnp

    params = [jnp.eye(64) * 0.5 for _ in range(layers)]
    lowered = jax.jit(_step(jax, jnp)).lower(params, jnp.ones((8, 64)))
    started = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - started


def _slow_layers() -> int:
    """Enough layers that the slow program compiles in about SLOW_COMPILE_S here, whatever the machine's speed, so
    that JAX stores a non-zero compile time. Measured in a fresh process: JAX decides about its cache at the first
    compile of a process, so this one must not compile before the cache is set up."""
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--calibrate", str(CALIBRATION_LAYERS)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    seconds = float(proc.stdout.strip().splitlines()[-1])
    return max(250, min(4000, int(CALIBRATION_LAYERS * SLOW_COMPILE_S / max(seconds, 1e-3))))


def main() -> int:
    if sys.argv[1:2] == ["--calibrate"]:
        print(_calibrate(int(sys.argv[2])))
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("cache_dir")
    parser.add_argument("manifest")
    parser.add_argument("--no-zstd", action="store_true", help="make zstandard unimportable: JAX falls back to zlib")
    parser.add_argument("--lru", action="store_true", help="set jax_compilation_cache_max_size (writes -atime files)")
    args = parser.parse_args()

    if args.no_zstd:
        sys.modules["zstandard"] = None  # type: ignore[assignment]  # import now raises ImportError
    os.environ["JAX_PLATFORMS"] = "cpu"

    written: list[tuple[str, str]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.msg.startswith("Writing %s to persistent compilation cache"):
                written.append((str(record.args[0]), str(record.args[1])))

    cc_logger = logging.getLogger("jax._src.compilation_cache")
    cc_logger.setLevel(logging.DEBUG)
    cc_logger.addHandler(Capture())

    layers = _slow_layers()
    import jax
    import jax.numpy as jnp
    from jax._src import compilation_cache as cc

    jax.config.update("jax_compilation_cache_dir", args.cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if args.lru:
        jax.config.update("jax_compilation_cache_max_size", 512 * 1024 * 1024)

    train_step = jax.jit(_step(jax, jnp))

    def tiny(x):
        return x * 2 + 1

    def odd(x):
        return jnp.sin(x) + jnp.cos(x)

    odd.__name__ = "odd-name.v2"  # a module name with '-' and '.': parsers must split from the right

    # Unrolled layers, as many as make it compile in seconds here: JAX then stores a non-zero compile time.
    params = [jnp.eye(64) * 0.5 for _ in range(layers)]
    x = jnp.ones((8, 64))
    jax.block_until_ready(train_step(params, x))
    jax.block_until_ready(jax.jit(tiny)(jnp.arange(4.0)))
    jax.block_until_ready(jax.jit(lambda v: v @ v.T)(x))
    jax.block_until_ready(jax.jit(odd)(x))

    if not written:
        print("JAX logged no cache writes (a warning above usually says why)", file=sys.stderr)
        return 1
    compression = "zstd" if cc.zstandard is not None or getattr(cc, "zstd", None) is not None else "zlib"
    if args.cache_dir.startswith("gs://"):
        # Read back with google-cloud-storage: gcsfs's prefetching reader can stall against an emulator.
        from google.cloud import storage

        bucket_name, _, prefix = args.cache_dir[len("gs://"):].partition("/")
        bucket = storage.Client().bucket(bucket_name)
        base = prefix.strip("/") + "/" if prefix.strip("/") else ""
        names = {b.name[len(base):] for b in bucket.list_blobs(prefix=base)}

        def read(name: str) -> bytes:
            return bucket.blob(base + name).download_as_bytes()
    elif "://" in args.cache_dir:
        # Another object store: read back through the path JAX wrote through (etils epath and fsspec's s3fs, adlfs).
        from etils import epath

        root = epath.Path(args.cache_dir)
        names = {p.name for p in root.iterdir()}

        def read(name: str) -> bytes:
            return (root / name).read_bytes()
    else:
        names = set(os.listdir(args.cache_dir))

        def read(name: str) -> bytes:
            with open(os.path.join(args.cache_dir, name), "rb") as f:
                return f.read()

    entries = []
    for module, key in written:
        data = read(key + "-cache")
        _, seconds = cc.extract_executable_and_time(cc.decompress_executable(data))
        entries.append({
            "file": key + "-cache", "key": key, "module": module, "size_bytes": len(data),
            "compression": compression, "stored_compile_seconds": seconds,
            "has_atime": key + "-atime" in names,
        })
    manifest = {
        "jax": jax.__version__, "python": sys.version.split()[0], "compression": compression, "entries": entries,
    }
    with open(args.manifest, "w") as f:
        json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
