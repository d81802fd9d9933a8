"""What a later ``enable_cache()`` call asked for that a process's claimed session overrides.

A tool that runs a user's script under its own settings (``warmup --script``) claims its session
(:meth:`CacheSession.claim_process`); the script's own ``enable_cache()`` then gets that session, and this module
words the one notice that says which of the script's settings did not apply.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from jaxcache.client.errors import CacheAlreadyInitializedError
from jaxcache.client.options import ClientOptions
from jaxcache.errors import InvalidInputError
from jaxcache.storage import normalise_root

SETTINGS = ("cache_dir", "job", "min_compile_time_secs", "min_entry_size_bytes", "xla_caches", "max_size_bytes",
            "service_url", "token", "trust", "verify", "pack")


def overridden(mine: ClientOptions, asked: Mapping[str, object]) -> dict[str, object]:
    """``{setting: what the call asked}`` for each setting the call gave that differs from ``mine``'s (unset
    arguments ask nothing)."""
    out: dict[str, object] = {}
    for name in SETTINGS:
        wanted = asked.get(name)
        if wanted is None:
            continue
        if name == "cache_dir":
            try:
                spelled = isinstance(wanted, (str, os.PathLike)) and normalise_root(wanted)
            except InvalidInputError:
                spelled = False
            same = spelled == mine.cache_dir
        elif name == "service_url":
            same = isinstance(wanted, str) and wanted.rstrip("/") == mine.service_url
        elif name == "min_compile_time_secs":
            same = isinstance(wanted, (int, float)) and float(wanted) == mine.min_compile_time_secs
        else:
            same = wanted == getattr(mine, name)
        if not same:
            out[name] = wanted
    return out


def notice(mine: ClientOptions, owner: str, asked: Mapping[str, object]) -> tuple[int, str]:
    """The log level and text of the notice (``owner`` as a noun phrase: "the warm-up"). WARNING when the script
    names another cache directory: run as a job, it would read a cache that this run does not fill, which is worth
    a look; other settings (job name, thresholds) are the owner's to choose, so INFO."""
    found = overridden(mine, asked)
    head = (f"jaxcache: {owner} runs this script under its own cache settings: the script's enable_cache() got"
            f" {owner}'s session (cache {mine.cache_dir}, job {mine.job})")
    if not found:
        return logging.INFO, head
    shown = ", ".join(
        "token" if name == "token" else f"{name}={value!r} ({owner}'s: {getattr(mine, name)!r})"
        for name, value in found.items()
    )
    text = f"{head}; these settings of the script did not apply: {shown}"
    if "cache_dir" in found:
        text += f". Run as a job, the script would use another cache than the one {owner} fills"
        return logging.WARNING, text
    return logging.INFO, text


def check_same(mine: ClientOptions, theirs: ClientOptions) -> None:
    """Raise :class:`CacheAlreadyInitializedError` when a second ``enable_cache()`` call (not in a claimed process)
    asks for other settings than the first."""
    differs = [name for name in (*SETTINGS, "local_dirs") if getattr(mine, name) != getattr(theirs, name)]
    if differs:
        shown = ", ".join(
            f"{n}: {getattr(mine, n)!r} then {getattr(theirs, n)!r}" if n != "token" else "token differs"
            for n in differs
        )
        raise CacheAlreadyInitializedError(
            f"enable_cache() was already called in this process with other settings ({shown}); JAX's cache can"
            " be set up once per process: call it once, early, with the settings you want"
        )
