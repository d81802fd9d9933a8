"""The argument parser every command line of jaxcache uses: a usage error is one line on stderr, exit 2.

argparse prints the whole usage block before its error (five to eight lines for ``prune``), which buries the one line
that says what was wrong; ``--help`` still prints the usage. And argparse reads a value that starts with ``-`` as
the next option (``--unused-for -3d``: "expected one argument", although the value is there): here a value that is
no option of the command is the option's value, which its own check then judges (a negative duration, say).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from jaxcache.cli.output import EXIT_USAGE


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with one-line errors (``PROG: error: WHAT``, exit 2), and values that look like
    options (``-3d``) taken as values. Subcommands' parsers are of this class too (``add_subparsers``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[Any, list[str]]:
        listed = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._values_joined(listed), namespace)

    def _values_joined(self, args: list[str]) -> list[str]:
        """``--opt -3d`` as ``--opt=-3d`` where ``--opt`` takes one value and ``-3d`` is none of this parser's
        options: argparse would take ``-3d`` for an option. Stops at ``--`` and at the first subcommand, whose own
        parser joins its options."""
        single = {s for a in self._actions for s in a.option_strings if a.nargs is None and s.startswith("--")}
        known = {s for a in self._actions for s in a.option_strings}
        commands = {name for a in self._actions if a.nargs == argparse.PARSER for name in (a.choices or ())}
        out: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--" or arg in commands:
                return out + args[i:]
            nxt = args[i + 1] if i + 1 < len(args) else None
            if (arg in single and nxt is not None and nxt.startswith("-") and nxt != "--"
                    and nxt.partition("=")[0] not in known and not nxt.startswith("--")):
                out.append(f"{arg}={nxt}")
                i += 2
                continue
            out.append(arg)
            i += 1
        return out
