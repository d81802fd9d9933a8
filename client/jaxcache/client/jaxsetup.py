"""Everything the client knows about JAX's internals, in one place, pinned by contract tests per JAX version.

These are private details of ``jax._src.compilation_cache`` and ``jax._src.xla_bridge`` (docs/jax-internals.md). When a
future JAX moves them, the functions here degrade to the public config (and say so at DEBUG) instead of failing.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

import jax

from jaxcache.client.errors import CacheAlreadyInitializedError
from jaxcache.errors import MissingDependencyError
from jaxcache.records import Fingerprint

log = logging.getLogger("jaxcache.client")


def jax_version() -> tuple[int, ...]:
    """``jax.__version__`` as numbers (``0.10.2`` → ``(0, 10, 2)``)."""
    parts = []
    for piece in jax.__version__.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def default_xla_caches() -> str | None:
    """``"none"`` where JAX hashes the XLA autotune-cache *path* into keys (jax < 0.11), else leave JAX's default.

    With JAX's default on those versions, a cache mounted at another path (or spelled differently) misses
    everything. ``"none"`` turns off XLA's per-fusion autotune cache beside the entries: GPU jobs then re-run
    autotuning for programs they compile, but never for programs they load from the cache, which hold the
    tuned result. From jax 0.11 the path is blanked before hashing, so the default is kept there.
    """
    return "none" if jax_version() < (0, 11) else None


def compression_library() -> str:
    """The library name JAX hashes into keys ("zstandard" or "zlib"); refuses to run without zstandard.

    A process without zstandard computes other keys than every process with it: it would never hit.
    """
    from jax._src import compilation_cache as cc

    if getattr(cc, "zstandard", None) is not None or getattr(cc, "zstd", None) is not None:
        return "zstandard"
    raise MissingDependencyError(
        "JAX cannot import zstandard here, so its cache keys would differ from every other job's and it would"
        " never hit the shared cache: pip install zstandard (jaxcache depends on it; is this the right venv?)"
    )


def check_not_compiled(cache_dir: str) -> None:
    """Raise :class:`CacheAlreadyInitializedError` when JAX has already decided about its persistent cache.

    JAX checks once per process whether the cache is used, at the first compile, and never again: configuring
    it afterwards silently does nothing.
    """
    from jax._src import compilation_cache as cc

    current = jax.config.jax_compilation_cache_dir
    initialized = getattr(cc, "_cache_initialized", None)
    checked = getattr(cc, "_cache_checked", None)
    if initialized is None or checked is None:
        log.debug("this JAX has no _cache_initialized/_cache_checked; cannot tell whether it compiled already")
        return
    if initialized and current and current != cache_dir:
        raise CacheAlreadyInitializedError(
            f"JAX already opened the persistent cache at {current!r}, not {cache_dir!r}: call"
            " jaxcache.client.enable_cache() first, before anything compiles (a jit call, an array operation)"
        )
    if checked:
        where = f"with the cache at {current!r}" if current else "without a persistent cache"
        raise CacheAlreadyInitializedError(
            f"JAX has already compiled {where}, and it decides about the cache only once per process: call"
            " jaxcache.client.enable_cache() earlier, before the first jit call or array operation"
        )


def apply(settings: dict[str, Any]) -> None:
    """Set JAX config values (``jax.config.update``), all or nothing."""
    previous = {name: getattr(jax.config, name) for name in settings}
    try:
        for name, value in settings.items():
            jax.config.update(name, value)
    except Exception:
        for name, value in previous.items():
            jax.config.update(name, value)
        raise
    if not jax.config.jax_enable_compilation_cache:
        log.warning("jax_enable_compilation_cache is False here: JAX will not use the cache until it is True")


def backend_ready() -> bool:
    """True once JAX's backend is initialized, so asking for devices does not start it early.

    Starting it in enable_cache() would break ``jax.distributed.initialize()`` called after it.
    """
    from jax._src import xla_bridge

    probe = getattr(xla_bridge, "backends_are_initialized", None)
    if probe is not None:
        return bool(probe())
    return bool(getattr(xla_bridge, "_backends", None))


def processes() -> tuple[int, int]:
    """``(process_index, process_count)``, without starting the backend."""
    if backend_ready():
        return jax.process_index(), jax.process_count()
    from jax._src import distributed

    state = distributed.global_state
    return int(getattr(state, "process_id", 0) or 0), int(getattr(state, "num_processes", 1) or 1)


def fingerprint(compression: str) -> Fingerprint:
    """Everything besides the program that enters keys; device fields only once the backend is up."""
    import jaxlib

    fields: dict[str, Any] = {}
    if backend_ready():
        devices = jax.devices()
        fields = dict(
            backend=jax.default_backend(),
            device_kind=devices[0].device_kind if devices else None,
            device_count=len(devices),
            local_device_count=jax.local_device_count(),
            process_count=jax.process_count(),
        )
    flags = os.environ.get("XLA_FLAGS", "")
    return Fingerprint(
        jax=jax.__version__,
        jaxlib=getattr(jaxlib, "__version__", None) or jax.__version__,
        compression=compression,
        xla_flags_digest=hashlib.sha256(flags.encode()).hexdigest()[:16],
        xla_caches=jax.config.jax_persistent_cache_enable_xla_caches,
        **fields,
    )
