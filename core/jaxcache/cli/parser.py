"""The argument parser every command line of jaxcache uses: a usage error is one line on stderr, exit 2.

argparse prints the whole usage block before its error (five to eight lines for ``prune``), which buries the one line
that says what was wrong; ``--help`` still prints the usage. And argparse reads a value that starts with ``-`` as
the next option (``--unused-for -3d``: "expected one argument", although the value is there): here a value that is
no option of the command is the option's value, which its own check then judges (a negative duration, say). An
option mistyped (``ls --srot size ROOT``) is named, with the option meant, where argparse named what came after it
(``unrecognized arguments: ROOT``: its value taken for the root, the root left over).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from jaxcache.cli.output import EXIT_USAGE


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with one-line errors (``PROG: error: WHAT``, exit 2), and values that look like
    options (``-3d``) taken as values. Subcommands' parsers are of this class too (``add_subparsers``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        listed = list(sys.argv[1:] if args is None else args)
        parsed, extras = self.parse_known_args(listed, namespace)
        if extras:
            chain = self._chosen(parsed)
            typo = _unknown_option(self._values_joined(listed), chain)
            if typo is None:
                chain[-1].error(f"unrecognized arguments: {' '.join(extras)}")
            options = sorted({s for p in chain for a in p._actions for s in a.option_strings if s.startswith("--")})
            meant = difflib.get_close_matches(typo, options, n=1)
            chain[-1].error(f"unrecognized arguments: {typo}" + (f": did you mean {meant[0]}?" if meant else
                                                                  f" (see {chain[-1].prog} --help)"))
        return parsed

    def _chosen(self, parsed: Any) -> list[argparse.ArgumentParser]:
        """This parser and the subcommands' parsers ``parsed`` went through (``bundle export``: three)."""
        chain: list[argparse.ArgumentParser] = [self]
        while True:
            sub = next((a for a in chain[-1]._actions if isinstance(a, argparse._SubParsersAction)), None)
            name = getattr(parsed, sub.dest, None) if sub is not None and sub.dest != argparse.SUPPRESS else None
            if sub is None or name not in (sub.choices or {}):
                return chain
            chain.append(sub.choices[name])

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


def _unknown_option(args: list[str], chain: list[argparse.ArgumentParser]) -> str | None:
    """The first argument that is written as an option and is none of the parsers' options (nor, as argparse allows,
    the start of exactly one of them); None when every extra is a value."""
    known = {s for p in chain for a in p._actions for s in a.option_strings}
    for arg in args:
        if arg == "--":
            return None
        if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():  # a value: stdin, a negative number
            continue
        name = arg.partition("=")[0]
        if name not in known and len([k for k in known if k.startswith(name)]) != 1:
            return name
    return None
