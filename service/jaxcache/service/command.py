"""``jaxcache serve``, the service's subcommand of the core CLI (the ``jaxcache.commands`` entry point)."""

from __future__ import annotations

import argparse
from typing import Any

from jaxcache.cli.output import EXIT_OK, non_negative
from jaxcache.cli.plugins import Command
from jaxcache.errors import InvalidInputError

_DESCRIPTION = (
    "Serve the catalog of one or more cache roots over HTTP. Every flag can also be set with the environment "
    "variable of the same name: JAXCACHE_CACHES (JSON object name->URL), JAXCACHE_HOST, JAXCACHE_PORT, JAXCACHE_DB, "
    "JAXCACHE_WORKERS, JAXCACHE_ROLE, JAXCACHE_RESCAN_S, JAXCACHE_TOKENS, JAXCACHE_TOKENS_FILE, "
    "JAXCACHE_INSECURE_NO_AUTH. Flags win over the environment."
)


def configure(sv: argparse.ArgumentParser) -> None:
    sv.add_argument("--cache", metavar="NAME=URL", action="append", default=[],
                    help="a cache root to serve under NAME (repeatable), e.g. --cache prod=gs://bucket/jax-cache")
    sv.add_argument("--host", help="address to listen on (default 127.0.0.1; others need tokens)")
    sv.add_argument("--port", type=non_negative, help="port (default 8080)")
    sv.add_argument("--db", metavar="URL",
                    help="catalog database as an SQLAlchemy URL (default: an SQLite file under ~/.local/state);"
                         " put a password in JAXCACHE_DB instead, where other users' `ps` cannot see it")
    sv.add_argument("--workers", type=positive, metavar="N",
                    help="processes serving requests (uvicorn's workers), each using a CPU; with loops, each "
                         "background pass runs in one of them at a time (default: the CPUs this process may use, "
                         "its cgroup's CPU quota included, at most 4)")
    sv.add_argument("--role", choices=("all", "api", "loops"),
                    help="what this process does: api answers requests only; loops runs the background loops "
                         "(report drain, rescans, verification, retention) and answers requests too; all (default) "
                         "both. Split under load: api processes and one loops process on one catalog")
    sv.add_argument("--rescan-s", type=float, metavar="SECONDS", help="seconds between background rescans (300)")
    sv.add_argument("--tokens-file", metavar="PATH", help="lines of '<sha256 hex of token> <read|report|admin>'")
    sv.add_argument("--insecure-no-auth", action="store_true", default=None,
                    help="serve every route without tokens on any address (labs only)")


def positive(text: str) -> int:
    """An argparse type: a whole number >= 1 (as the core CLI's ``non_negative``)."""
    value = non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def run(args: argparse.Namespace) -> int:
    """Build settings from the environment, let flags override, and run the service."""
    from pydantic import ValidationError

    from jaxcache.service.server import serve
    from jaxcache.service.settings import ServiceSettings

    overrides: dict[str, Any] = {}
    if args.cache:
        caches = {}
        for item in args.cache:
            name, sep, url = item.partition("=")
            if not sep or not name or not url:
                raise InvalidInputError(f"--cache {item!r}: expected NAME=URL, e.g. demo=./demo-cache")
            caches[name] = url
        overrides["caches"] = caches
    flags = ("host", "port", "db", "workers", "role", "rescan_s", "tokens_file", "insecure_no_auth")
    overrides.update({flag: value for flag in flags if (value := getattr(args, flag)) is not None})
    try:
        settings = ServiceSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError(f"bad service settings: {problems}") from None
    serve(settings)
    return EXIT_OK


COMMAND = Command("serve", "run the catalog service (REST API, dashboard, metrics) over named cache roots",
                  configure=configure, run=run, description=_DESCRIPTION)
