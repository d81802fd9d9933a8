"""Integrity passes over a cache's entries: one asked for by a route, and the background loop's throttled ones."""

from __future__ import annotations

import threading

from jaxcache.service.integrity import verification
from jaxcache.service.rescan.scan import ensure_scanned
from jaxcache.service.state import State


def verify(state: State, name: str, *, max_entries: int | None = None, recheck_all: bool = False,
           stop: threading.Event | None = None, throttled: bool = False) -> verification.VerifyPass:
    """One integrity pass over ``name`` (only what needs it unless ``recheck_all``)."""
    ensure_scanned(state, name)
    settings = state.settings
    result = verification.run_pass(
        state.catalog, name, state.storages[name], min_age_s=settings.verify_min_age_s, max_entries=max_entries,
        recheck_all=recheck_all, stop=stop, bytes_per_s=settings.verify_bytes_per_s if throttled else None,
        cpu_share=settings.verify_cpu_share if throttled else None, progress=state.loops.progress,
        trusted=settings.trusted,
    )
    state.refresh_integrity(name)
    return result


def verify_all(state: State, stop: threading.Event) -> list[tuple[str, Exception]]:
    """One throttled integrity pass over every cache; the caches whose pass failed, with why."""
    failed: list[tuple[str, Exception]] = []
    for name in state.settings.caches:
        if stop.is_set():
            break
        state.loops.on_cache(name)
        try:
            verify(state, name, stop=stop, throttled=True)
        except Exception as exc:  # noqa: BLE001 - one cache's failure must not stop the others' passes
            failed.append((name, exc))
    return failed
