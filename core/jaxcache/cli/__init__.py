"""The ``jaxcache`` command: wires storage, scanning and output together for each subcommand.

Exit codes: 0 ok, 1 problems found (``doctor``; some of a bundle left out), 2 usage or input error, or a store that
fails or cannot be reached (one line: a root in an object store is asked first whether it answers, within
``JAXCACHE_REACH_S``: :mod:`jaxcache.reach`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from jaxcache.cli import plugins
from jaxcache.cli.output import EXIT_OK, EXIT_USAGE
from jaxcache.cli.parser import ArgumentParser
from jaxcache.errors import JaxcacheError
from jaxcache.reach import answering
from jaxcache.storage import open_named_root

#: The core's commands, and the module under jaxcache.cli that defines each. A command's module is imported only
#: to run it or for --help: `jaxcache ls` of a large root takes well under a second, of which importing every
#: command (prune, explain, doctor) would be a good share.
CORE_COMMANDS = {"ls": "listing", "stats": "listing", "doctor": "doctor", "prune": "prune", "explain": "explain",
                 "keys": "keys", "bundle": "bundle"}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxcache")
    except PackageNotFoundError:  # run from a checkout without installing
        return "unknown"


class _VersionAction(argparse.Action):
    """``--version``, looking the version up only when asked (importlib.metadata is slow to import)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"jaxcache {_version()}")
        parser.exit()


def _add_command_parsers(sub: Any, module_name: str) -> None:
    module = importlib.import_module(f"jaxcache.cli.{module_name}")
    (getattr(module, "add_parsers", None) or module.add_parser)(sub)


def build_parser(command: plugins.Command | None = None, *, only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser, exposed for tests and for the user guide's synopsis. ``command``: the installed part's
    command being run, whose arguments the parser then knows. ``only``: a core command's name, to build just what
    running it needs."""
    parser = ArgumentParser(
        prog="jaxcache",
        description="Inspect and manage JAX persistent compilation caches on local/NFS directories and object stores "
                    "(GCS, S3, Azure Blob).",
        epilog="Exit codes: 0 ok, 1 problems found (doctor; bundle: see its --help), 2 usage or input error, or a store"
               " that fails or does not answer.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if only in CORE_COMMANDS:
        _add_command_parsers(sub, CORE_COMMANDS[only])
        return parser
    for module_name in dict.fromkeys(CORE_COMMANDS.values()):
        _add_command_parsers(sub, module_name)
    for name, part in plugins.OPTIONAL.items():
        if command is not None and command.name == name and command.configure is not None:
            p = sub.add_parser(name, help=command.help, description=command.description or command.help)
            command.configure(p)
        else:  # listed for --help; the part's own parser takes over when it runs
            sub.add_parser(name, help=part.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        command = plugins.load(argv[0]) if argv[:1] and argv[0] in plugins.OPTIONAL else None
        if command is not None and command.main is not None:
            return command.main(argv[1:])  # the part parses its own arguments (warmup's `--`)
        args = build_parser(command, only=argv[0] if argv else None).parse_args(argv)
        if command is not None:
            assert command.run is not None
            return command.run(args)
        # A store that does not answer is one line within seconds, not the minutes of its library's retries.
        storage = answering(open_named_root(args.root)) if args.root is not None else None  # `keys new`: no root
        exit_code: int = args.run(args, storage)
        return exit_code
    except JaxcacheError as exc:
        print(f"jaxcache: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("jaxcache: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `jaxcache ls ROOT | head`: the reader left; that is not an error. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
