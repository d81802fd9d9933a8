"""``jaxcache warmup``: the same command as ``warmup``, found by the core CLI through its entry point."""

from __future__ import annotations

from jaxcache.cli.plugins import Command


def _main(argv: list[str]) -> int:
    from jaxcache.warmup.cli import main

    return main(argv)


COMMAND = Command("warmup", "pre-fill a cache for a cluster topology (same as `warmup`; see warmup --help)", main=_main)
