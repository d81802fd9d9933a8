"""Subcommands that other parts add to ``jaxcache`` (``serve`` from the service, ``warmup`` from warm-up, ``tier``
from the client).

The core imports none of them: a part declares its command as an entry point in the group ``jaxcache.commands``
(its pyproject.toml), and the CLI loads it only when that command is asked for. Where the part is not installed,
the command still shows in ``--help`` and says how to install it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from jaxcache.errors import MissingDependencyError

GROUP = "jaxcache.commands"


@dataclass(frozen=True, slots=True)
class Command:
    """What a part's entry point names. Either ``configure`` and ``run`` (the CLI parses the arguments), or
    ``main`` alone (the command parses its own argv, as ``warmup`` does with its ``--``)."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None] | None = None
    run: Callable[[argparse.Namespace], int] | None = None
    main: Callable[[list[str]], int] | None = None
    description: str | None = None


@dataclass(frozen=True, slots=True)
class PartCommand:
    """A command of a part that may not be installed: its help line and where it comes from."""

    help: str
    distribution: str
    folder: str


#: The parts' commands, listed in --help whether or not their part is installed.
OPTIONAL: dict[str, PartCommand] = {
    "serve": PartCommand("run the catalog service (REST API, dashboard, metrics) over named cache roots",
                      "jaxcache-service", "service"),
    "warmup": PartCommand("pre-fill a cache for a cluster topology (same as `warmup`; see warmup --help)",
                       "jaxcache-warmup", "warmup"),
    "tier": PartCommand("the node-local tier: seed it from a pack in the root (tier seed; see tier seed --help)",
                     "jaxcache-client", "client"),
}


def load(name: str) -> Command:
    """The installed part's command ``name``; raises :class:`MissingDependencyError` naming what to install."""
    from importlib.metadata import entry_points  # only for a part's command: `ls` and the others start faster

    for ep in entry_points(group=GROUP, name=name):
        command = ep.load()
        if not isinstance(command, Command):
            raise MissingDependencyError(f"entry point {ep.value!r} for `jaxcache {name}` is not a Command")
        return command
    part = OPTIONAL[name]
    raise MissingDependencyError(
        f"`jaxcache {name}` comes with {part.distribution}, which is not installed here: pip install "
        f"{part.distribution} (from a checkout: pip install ./core ./{part.folder})"
    )
