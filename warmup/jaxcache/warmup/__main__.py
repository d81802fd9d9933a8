"""``python -m jaxcache.warmup``: the same as the ``warmup`` command."""

from __future__ import annotations

from jaxcache.warmup.cli import run

if __name__ == "__main__":
    run()
