"""JAX's persistent cache object, handed to JAX behind a proxy of ours: how the put hook hears what JAX writes and
the read hook judges what it loads (docs/jax-internals.md, "Put hook" and "Read hook"). JAX looks
``compilation_cache._get_cache`` up in its module at each read and write, so wrapping that one function reaches
both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def wrap(proxy: Callable[[Any], Any]) -> Callable[[], None] | None:
    """Make ``compilation_cache._get_cache`` return ``proxy(cache)`` for JAX's cache object; the undo, or None
    where this JAX has no such function to wrap. Proxies stack: the put and read hooks may both be on."""
    from jax._src import compilation_cache as cc

    original = getattr(cc, "_get_cache", None)
    if original is None:
        return None
    active = [True]

    def _get_cache(backend: Any) -> Any:
        cache = original(backend)
        return proxy(cache) if cache is not None and active[0] else cache

    cc._get_cache = _get_cache

    def undo() -> None:
        active[0] = False  # another wrapper may sit on top of ours: then ours stays, passing through
        if cc._get_cache is _get_cache:
            cc._get_cache = original

    return undo
