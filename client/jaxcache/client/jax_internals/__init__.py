"""Everything jaxcache relies on that JAX does not promise: private modules and attributes, the texts of its cache
log records, its monitoring event names. One module, so that a JAX release that moves one of them breaks here and
in :func:`probe` (which the test suite runs on every supported JAX), not silently elsewhere. What each item is and
why it matters: docs/jax-internals.md.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import logging
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from jaxcache import keyparts
from jaxcache.client.errors import CacheAlreadyInitializedError
from jaxcache.client.jax_internals import cache_proxy, compile_options, reads
from jaxcache.client.jax_internals.mlir import MLIR_NAMES, entry_signature
from jaxcache.errors import MissingDependencyError
from jaxcache.keyparts import OptionFields, ProgramSignature
from jaxcache.records import Fingerprint

log = logging.getLogger("jaxcache.client")

#: The loggers whose DEBUG records name the key of each lookup, and what became of it.
LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache")
#: The logger whose DEBUG records give the hash of each part of a key as JAX computes it (docs: "Key parts").
KEY_LOGGER = "jax._src.cache_key"

# jax.monitoring events, fired on the compiling thread.
REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"
WRITES = "/jax/compilation_cache/cache_misses"  # JAX fires its "miss" event only when it writes
SAVED = "/jax/compilation_cache/compile_time_saved_sec"
RETRIEVAL = "/jax/compilation_cache/cache_retrieval_time_sec"
COMPILE = "/jax/core/compile/backend_compile_duration"  # wraps the whole compile-or-load of one program
EVENTS = (REQUESTS, HITS, WRITES, SAVED, RETRIEVAL, COMPILE)


@dataclass(frozen=True, slots=True)
class LogText:
    """The start of a log message JAX writes, as its source spells the format string."""

    prefix: str
    logger: str
    #: False for texts only some supported versions write (jax 0.12 caches programs with host callbacks, so it
    #: no longer says it will not).
    everywhere: bool = True


HIT_MSG = LogText("Persistent compilation cache hit for", "jax._src.compiler")
MISS_MSG = LogText("PERSISTENT COMPILATION CACHE MISS for", "jax._src.compiler")
WRITE_MSG = LogText("Writing %s to persistent compilation cache", "jax._src.compilation_cache")
TOOK_MSG = LogText("'%s' took at least", "jax._src.compiler")
FAST_MSG = LogText("Not writing persistent cache entry for '%s' because it took <", "jax._src.compiler")
CALLBACK_MSG = LogText("Not writing persistent cache entry for '%s' because it uses host", "jax._src.compiler",
                       everywhere=False)
NOT_P0_MSG = LogText("Not writing persistent cache entry since process_id != 0", "jax._src.compiler")
SMALL_MSG = LogText("Not writing persistent cache entry with key %r since its size", "jax._src.compilation_cache")
DISABLED_MSG = LogText("Not writing persistent cache entry with key %r since cache is disabled",
                       "jax._src.compilation_cache")
PART_MSG = LogText("get_cache_key hash of serialized %s: %s", KEY_LOGGER)  # (label, that part's own hash)
SO_FAR_MSG = LogText("get_cache_key hash after serializing %s: %s", KEY_LOGGER)  # (label, hash of all so far)
FLAG_MSG = LogText("Including XLA flag in cache key: %s", KEY_LOGGER)
KEY_TEXTS = (PART_MSG, SO_FAR_MSG, FLAG_MSG)
LOG_TEXTS = (HIT_MSG, MISS_MSG, WRITE_MSG, TOOK_MSG, FAST_MSG, CALLBACK_MSG, NOT_P0_MSG, SMALL_MSG, DISABLED_MSG,
             *KEY_TEXTS)
#: JAX's label of each part of a key (as cache_key.get names them, in its order) → jaxcache's part name.
PART_LABELS = {
    "computation": keyparts.COMPUTATION,
    "jax_lib version": keyparts.JAXLIB,
    "backend version": keyparts.BACKEND,
    "XLA flags": keyparts.XLA_FLAGS,
    "compile_options": keyparts.COMPILE_OPTIONS,
    "accelerator_config": keyparts.DEVICES,
    "compression": keyparts.COMPRESSION,
    "custom_hook": keyparts.CUSTOM_HOOK,
}

#: Private attributes read, by module: ``(module, attribute, alternatives)``; one of them must exist.
ATTRIBUTES = (
    ("jax._src.compilation_cache", "_cache_initialized", ()),
    ("jax._src.compilation_cache", "_cache_checked", ()),
    ("jax._src.compilation_cache", "zstandard", ("zstd",)),
    ("jax._src.xla_bridge", "backends_are_initialized", ("_backends",)),
    ("jax._src.distributed", "global_state", ()),
    ("jax._src.compilation_cache", "get_cache_key", ()),
    ("jax._src.compilation_cache", "_get_cache", ()),
    ("jax._src.cache_key", "xla_flags_to_exclude_from_cache_key", ()),
)
_EVENT_MODULES = ("jax._src.compiler", "jax._src.compilation_cache", "jax._src.dispatch")
_warned: set[str] = set()
_said: set[str] = set()


def jax_version() -> tuple[int, ...]:
    """``jax.__version__`` as numbers (``0.10.2`` → ``(0, 10, 2)``)."""
    parts = []
    for piece in jax.__version__.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def degraded(what: str) -> None:
    """Say once, at WARNING, that this JAX lacks something jaxcache reads (telemetry may then be incomplete)."""
    if what not in _warned:
        _warned.add(what)
        log.warning("jaxcache: JAX %s %s; jaxcache's record of this process may be incomplete (run "
                    "jaxcache.client.jax_internals.probe() for what else moved, and see docs/jax-internals.md)",
                    jax.__version__, what)


def less_detail(what: str) -> None:
    """Say once, at INFO, that this JAX lacks something only the finer detail of run records needs."""
    if what not in _said:
        _said.add(what)
        log.info("jaxcache: JAX %s %s (see docs/jax-internals.md)", jax.__version__, what)


def default_xla_caches() -> str | None:
    """``"none"`` where JAX hashes the XLA autotune-cache *path* into keys (jax < 0.11), else leave JAX's default.

    With JAX's default on those versions, a cache mounted at another path (or spelled differently) misses
    everything. From jax 0.11 the path is blanked before hashing, so the default is kept there.
    """
    return "none" if jax_version() < (0, 11) else None


def compression_library() -> str:
    """The library name JAX hashes into keys, read the way its key code reads it: "zstandard" when its
    compilation_cache module holds the zstandard module, else "zlib". Refuses to run without zstd at all.

    On Python >= 3.14 JAX compresses with the standard library's compression.zstd and leaves that attribute None,
    so it hashes "zlib" although the entries are zstd: such a process shares keys only with its like, which the
    fingerprint's python field makes visible. A process with no zstd at all would never hit the shared cache.
    """
    from jax._src import compilation_cache as cc

    if getattr(cc, "zstandard", None) is not None:
        return "zstandard"
    if getattr(cc, "zstd", None) is not None:
        if "zstd-hashed-as-zlib" not in _warned:
            _warned.add("zstd-hashed-as-zlib")
            log.warning("jaxcache: JAX %s on Python %s compresses with compression.zstd but hashes 'zlib' into its"
                        " cache keys: this process hits only entries written on the same Python and JAX",
                        jax.__version__, platform.python_version())
        return "zlib"
    raise MissingDependencyError(
        "JAX cannot import zstandard here, so its cache keys would differ from every other job's and it would"
        " never hit the shared cache: pip install zstandard (jaxcache depends on it; is this the right venv?)"
    )


def flags_outside_key() -> frozenset[str] | None:
    """The flag names (``--xla_dump_to``) JAX leaves out of its cache keys, from its own list: dump and other flags
    that cannot change what a program compiles to, so they change no hit. None where this JAX has no such list.
    JAX matches a flag by its text before the first ``=``."""
    from jax._src import cache_key

    found = getattr(cache_key, "xla_flags_to_exclude_from_cache_key", None)
    if not isinstance(found, (list, tuple, set, frozenset)) or not all(isinstance(f, str) for f in found):
        return None
    return frozenset(found)


def check_not_compiled(cache_dir: str) -> None:
    """Raise :class:`CacheAlreadyInitializedError` when JAX has already decided about its persistent cache.

    JAX checks once per process whether the cache is used, at the first compile, and never again: configuring
    it afterwards silently does nothing.
    """
    from jax._src import compilation_cache as cc

    # jax.config's options are properties JAX adds at run time; its annotations do not list them.
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    initialized = getattr(cc, "_cache_initialized", None)
    checked = getattr(cc, "_cache_checked", None)
    if initialized is None or checked is None:
        degraded("has no compilation_cache._cache_initialized/_cache_checked: whether it compiled already is unknown")
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
            jax.config.update(name, value)  # type: ignore[no-untyped-call]  # JAX leaves it unannotated
    except Exception:
        for name, value in previous.items():
            jax.config.update(name, value)  # type: ignore[no-untyped-call]  # JAX leaves it unannotated
        raise
    if not jax.config.jax_enable_compilation_cache:  # type: ignore[attr-defined]  # added at run time
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


def fingerprint(compression: str, xla_flags: tuple[str, ...] | None = None) -> Fingerprint:
    """Everything besides the program that enters keys; device fields only once the backend is up. ``xla_flags``:
    those JAX hashed into the last key (:data:`FLAG_MSG`), None before any lookup or where this JAX does not say."""
    import jaxlib

    fields: dict[str, Any] = {}
    if backend_ready():
        from jax.extend import backend as extend_backend

        devices = jax.devices()
        fields = dict(
            backend=jax.default_backend(),
            device_kind=devices[0].device_kind if devices else None,
            device_count=len(devices),
            local_device_count=jax.local_device_count(),
            process_count=jax.process_count(),
            platform_version=str(getattr(extend_backend.get_backend(), "platform_version", "")) or None,
        )
    flags = os.environ.get("XLA_FLAGS", "")
    return Fingerprint(
        jax=jax.__version__,
        jaxlib=getattr(jaxlib, "__version__", None) or jax.__version__,
        compression=compression,
        xla_flags_digest=hashlib.sha256(flags.encode()).hexdigest()[:16],
        xla_caches=jax.config.jax_persistent_cache_enable_xla_caches,  # type: ignore[attr-defined]  # run-time option
        python=platform.python_version(),
        xla_flags=xla_flags,
        **fields,
    )


#: What the key hook hands on besides the key and signature: the key's compile options as named fields, given the
#: XLA flags JAX hashed (:func:`jaxcache.client.jax_internals.compile_options.hashed_fields`).
OptionsOf = Callable[[tuple[str, ...]], OptionFields | None]


def hook_cache_keys(on_key: Callable[[str, ProgramSignature | None, OptionsOf | None], None]
                    ) -> Callable[[], None] | None:
    """Wrap ``compilation_cache.get_cache_key`` so that ``on_key(key, signature, options_of)`` hears of every key JAX
    computes, with its program's entry signature and a way to read its compile options, on the compiling thread.
    Returns the undo; None where there is nothing to wrap. The compiler calls it through the module attribute,
    which is what makes wrapping it work."""
    from jax._src import compilation_cache as cc

    original = getattr(cc, "get_cache_key", None)
    if original is None:
        return None
    active = [True]

    def get_cache_key(module: Any, *args: Any, **kwargs: Any) -> Any:
        key = original(module, *args, **kwargs)
        if active[0]:
            try:
                # get_cache_key(module, devices, compile_options, backend, ...)
                options = kwargs.get("compile_options", args[1] if len(args) > 1 else None)
                backend = kwargs.get("backend", args[2] if len(args) > 2 else None)
                options_of = None if options is None else functools.partial(
                    compile_options.hashed_fields, options, str(getattr(backend, "platform", "")))
                on_key(str(key), entry_signature(module), options_of)
            except Exception:  # noqa: BLE001, S110 - reading the signature must never break a compile
                pass
        return key

    cc.get_cache_key = get_cache_key

    def undo() -> None:
        active[0] = False  # another wrapper may sit on top of ours: then it stays, doing nothing
        if cc.get_cache_key is get_cache_key:
            cc.get_cache_key = original

    return undo


def hook_cache_puts(on_put: Callable[[str, bytes], None]) -> Callable[[], None] | None:
    """Wrap ``compilation_cache._get_cache`` so that ``on_put(key, value)`` hears of the exact bytes JAX hands its
    cache's ``put``, before they are stored (docs/jax-internals.md, "Put hook"): what a signature vouches for is
    what JAX wrote, never a read-back an attacker could have planted. Returns the undo; None where there is
    nothing to wrap. ``put_executable_and_time`` looks ``_get_cache`` up in its module at each call."""
    return cache_proxy.wrap(lambda cache: _PutTap(cache, on_put))


class _PutTap:
    """JAX's cache object with ``put`` heard first; everything else passes through."""

    def __init__(self, cache: Any, on_put: Callable[[str, bytes], None]) -> None:
        self._tapped = cache
        self._on_put = on_put

    def put(self, key: str, value: bytes) -> None:
        try:
            self._on_put(str(key), bytes(value))
        except Exception:  # noqa: BLE001, S110 - hearing of a write must never break it
            pass
        self._tapped.put(key, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tapped, name)


def _literals(module_name: str) -> set[str]:
    """Every string constant in a module's source (adjacent literals joined, as the parser joins them)."""
    import importlib

    source = inspect.getsource(importlib.import_module(module_name))
    return {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _calls_through_module(module_name: str, module_alias: str, function: str) -> bool:
    """Whether a module's source calls ``module_alias.function(...)``: a wrapper set on that attribute is seen."""
    import importlib

    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == function
               and isinstance(n.func.value, ast.Name) and n.func.value.id == module_alias for n in ast.walk(tree))


def _put_through_get_cache() -> bool:
    """Whether ``put_executable_and_time`` gets its cache from ``_get_cache(...)`` and calls ``.put`` on it."""
    from jax._src import compilation_cache as cc

    put = getattr(cc, "put_executable_and_time", None)
    if put is None:
        return False
    tree = ast.parse(inspect.getsource(put).lstrip())
    names = {f.id if isinstance(f, ast.Name) else f.attr for n in ast.walk(tree) if isinstance(n, ast.Call)
             for f in (n.func,) if isinstance(f, (ast.Name, ast.Attribute))}
    return "_get_cache" in names and "put" in names


def probe(*, attributes: tuple[tuple[str, str, tuple[str, ...]], ...] = ATTRIBUTES,
          log_texts: tuple[LogText, ...] = LOG_TEXTS, events: tuple[str, ...] = EVENTS,
          part_labels: tuple[str, ...] = tuple(PART_LABELS), mlir_names: tuple[str, ...] = MLIR_NAMES) -> list[str]:
    """What this JAX lacks of everything listed here (or of what the arguments list instead), as messages; empty
    when all is where jaxcache expects it. Reads JAX's own source for the log texts and event names: no compile."""
    import importlib

    problems = []
    for module_name, attribute, alternatives in attributes:
        module = importlib.import_module(module_name)
        if not any(hasattr(module, a) for a in (attribute, *alternatives)):
            names = " or ".join((attribute, *alternatives))
            problems.append(f"{module_name} has no {names}")
    literals = {name: _literals(name) for name in {t.logger for t in log_texts} | {KEY_LOGGER, *_EVENT_MODULES}}
    for text in log_texts:
        if text.everywhere and not any(s.startswith(text.prefix) for s in literals[text.logger]):
            problems.append(f"{text.logger} no longer logs {text.prefix!r}")
    problems += [f"{KEY_LOGGER} no longer names a part {label!r}" for label in part_labels
                 if label not in literals[KEY_LOGGER]]
    if not _put_through_get_cache():
        problems.append("jax._src.compilation_cache.put_executable_and_time no longer stores through _get_cache(...)"
                        ".put (the put hook sees nothing: entries go unsigned)")
    if not _calls_through_module("jax._src.compiler", "compilation_cache", "get_cache_key"):
        problems.append("jax._src.compiler no longer calls compilation_cache.get_cache_key (the key hook sees nothing)")
    outside = flags_outside_key()
    if outside is not None and "--xla_dump_to" not in outside:  # (its absence is an attribute above)
        problems.append("jax._src.cache_key.xla_flags_to_exclude_from_cache_key no longer lists --xla_dump_to: which"
                        " flags stay out of the key changed (warmup --flags-from-job takes only those in it)")
    from jaxlib.mlir import ir

    problems += [f"jaxlib.mlir.ir has no {n}" for n in mlir_names if not hasattr(ir, n)]
    found = set().union(*(literals[m] for m in _EVENT_MODULES))
    problems += [f"no module of {', '.join(_EVENT_MODULES)} records the event {e!r}" for e in events if e not in found]
    for name in ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
                 "jax_persistent_cache_min_entry_size_bytes", "jax_persistent_cache_enable_xla_caches",
                 "jax_compilation_cache_max_size", "jax_enable_compilation_cache",
                 # set by warm-up before the backend starts
                 "jax_platforms", "jax_num_cpu_devices", "jax_mock_gpu_topology"):
        if name not in jax.config.values:
            problems.append(f"jax.config has no {name}")
    # the read hook (verify=) and the compile options' fields, kept in modules of their own
    return problems + reads.problems() + compile_options.problems()
