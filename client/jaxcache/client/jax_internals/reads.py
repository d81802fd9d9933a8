"""The JAX wall, read side: a judge on the bytes JAX reads from its persistent cache, before it decompresses and
deserializes them (docs/jax-internals.md, "Read hook"). Part of :mod:`jaxcache.client.jax_internals`, whose
:func:`~jaxcache.client.jax_internals.probe` runs :func:`problems`.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from typing import Any

from jaxcache.client.jax_internals.cache_proxy import wrap

#: ``judge(cache_key, stored_bytes)``: None lets JAX load the bytes; a reason makes the lookup a miss.
Judge = Callable[[str, bytes], "str | None"]
#: What a judge that raised is taken to have said: a judge that cannot decide must not let JAX run the bytes.
JUDGE_FAILED = "could not be judged"


def hook_cache_reads(judge: Judge, on_refused: Callable[[str, str], None]) -> Callable[[], None] | None:
    """Wrap ``compilation_cache._get_cache`` so that every ``get`` of JAX's cache object hands the bytes it read to
    ``judge``; a reason turns them into None (a miss: JAX compiles) and ``on_refused(key, reason)`` hears of it.
    Runs on the compiling thread, on the bytes JAX is about to load: no second read. Returns the undo; None where
    there is nothing to wrap. ``get_executable_and_time`` looks ``_get_cache`` up in its module at each call."""
    return wrap(lambda cache: _JudgedReads(cache, judge, on_refused))


class _JudgedReads:
    """JAX's cache object whose ``get`` answers only what the judge lets through; everything else passes."""

    def __init__(self, cache: Any, judge: Judge, on_refused: Callable[[str, str], None]) -> None:
        self._judged = cache
        self._judge = judge
        self._on_refused = on_refused

    def get(self, key: str) -> bytes | None:
        value = self._judged.get(key)
        if value is None:
            return None
        try:
            reason = self._judge(str(key), bytes(value))
        except Exception as exc:  # noqa: BLE001 - never raise into JAX: refuse instead (fail closed, job runs)
            reason = f"{JUDGE_FAILED}: {type(exc).__name__}: {exc}"
        if reason is None:
            return value  # type: ignore[no-any-return]  # JAX's cache returns bytes
        try:
            self._on_refused(str(key), reason)
        except Exception:  # noqa: BLE001, S110 - hearing of a refusal must never break a compile
            pass
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._judged, name)


def hook_cache_gets(get: Callable[[Callable[[str], bytes | None], str], bytes | None]) -> Callable[[], None] | None:
    """Wrap ``compilation_cache._get_cache`` so that every ``get`` of JAX's cache object becomes ``get(cache_get,
    key)``: the client answers from JAX's directory itself (:mod:`jaxcache.client.jax_dir`), the node-local tier
    else from the shared root. Returns the undo; None where there is nothing to wrap."""
    return wrap(lambda cache: _TieredReads(cache, get))


class _TieredReads:
    """JAX's cache object whose ``get`` the client answers; everything else passes."""

    def __init__(self, cache: Any, get: Callable[[Callable[[str], bytes | None], str], bytes | None]) -> None:
        self._local = cache
        self._get = get

    def get(self, key: str) -> bytes | None:
        return self._get(self._local.get, str(key))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._local, name)


def _calls(function: Any) -> set[str]:
    """The names of what a function's source calls (``f(...)`` and ``x.f(...)``)."""
    tree = ast.parse(inspect.getsource(function).lstrip())
    return {f.id if isinstance(f, ast.Name) else f.attr for n in ast.walk(tree) if isinstance(n, ast.Call)
            for f in (n.func,) if isinstance(f, (ast.Name, ast.Attribute))}


#: The path of a load through JAX, as ``(module, function, what it must call)``: the compiler's cache read goes
#: through ``get_executable_and_time``, which takes the bytes from ``_get_cache(...).get`` before decompressing them.
READ_PATH = (
    ("jax._src.compiler", "_cache_read", ("get_executable_and_time",)),
    ("jax._src.compilation_cache", "get_executable_and_time", ("_get_cache", "get", "decompress_executable")),
)


def problems(read_path: tuple[tuple[str, str, tuple[str, ...]], ...] = READ_PATH) -> list[str]:
    """What this JAX lacks of the path the read hook relies on, as messages (empty: the hook sees every load)."""
    import importlib

    found = []
    for module_name, function, calls in read_path:
        code = getattr(importlib.import_module(module_name), function, None)
        try:
            missing = sorted(set(calls) - _calls(code)) if code is not None else [function]
        except (OSError, TypeError):  # no source to read (replaced at run time, or a build without .py files)
            found.append(f"{module_name}.{function}'s source cannot be read, so whether it still calls"
                         f" {', '.join(calls)} cannot be checked (the read hook may judge nothing)")
            continue
        if missing:
            found.append(f"{module_name}.{function} no longer calls {', '.join(missing)} (the read hook judges"
                         " nothing: verify= would skip no entry)" if code is not None else
                         f"{module_name} has no {function} (the read hook judges nothing: verify= would skip no"
                         " entry)")
    return found
