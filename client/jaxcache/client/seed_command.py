"""``jaxcache tier seed``: a node's tier seeded from a pack in the root before jobs land there (a Kubernetes DaemonSet
runs it on each node, deploy/k8s/node-tier-seed-daemonset.yaml), as the job's own start would seed it.

It reads the job's settings from the same variables the job does (``JAXCACHE_DIR``, ``JAXCACHE_PACK``,
``JAXCACHE_LOCAL_DIR``, ``JAXCACHE_VERIFY``, ``JAXCACHE_TRUSTED_KEYS``), flags winning, so it writes the very
directory, under the very trust policy, that the job's tier reads (:mod:`jaxcache.client.pack_seed` does the work).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from jaxcache.cli.output import ROOT_HELP, as_argument
from jaxcache.cli.plugins import Command
from jaxcache.display import shown
from jaxcache.errors import InvalidInputError
from jaxcache.units import format_bytes, parse_bytes, parse_duration

EXIT_OK, EXIT_NOT_SEEDED = 0, 1

_DESCRIPTION = """\
Seed a node-local tier from a pack in the cache root (`jaxcache bundle export ROOT --job J --pack NAME`, or
`warmup ... --pack NAME`), as the start of a job that names the pack would: one stat of the pack; where the tier
does not hold that version yet, the pack read with parallel ranged reads, checked whole as `jaxcache bundle
import` checks an archive (its structure and member names, each entry's digest and decompressed size, and under
--verify signed a trusted signature over each entry), and its entries admitted. Jobs that name the pack then load
its entries with no request but that one stat. Run it as the job's user (the tier refuses a directory that is not
its user's own), with the job's settings: each is read from the variable the job reads, a flag winning.

With --watch, it keeps the tier seeded: it looks at the pack again at that interval (one stat) and seeds the new
version when the pack is replaced (a new release), until stopped."""

_EPILOG = """\
examples:
  jaxcache tier seed gs://bucket/jax-cache --pack llm-2026-12 --local-dir /var/cache/jaxcache
  JAXCACHE_DIR=s3://bucket/jax-cache JAXCACHE_PACK=llm-2026-12 JAXCACHE_LOCAL_DIR=/var/cache/jaxcache \\
      jaxcache tier seed --watch 5m

exit codes: 0 the tier holds the pack as it is now (seeded, or held already); 1 it could not be seeded (no such
pack, the pack refused, the root did not answer); 2 bad input. With --watch it runs until stopped (exit 2 on bad
input only)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """``tier seed``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="tier_command", required=True, metavar="ACTION")
    seed = sub.add_parser("seed", help="seed a node-local tier from a pack in the root (as a job naming it would)",
                          description=_DESCRIPTION, epilog=_EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    seed.add_argument("root", metavar="ROOT", nargs="?", help=ROOT_HELP + " (default: JAXCACHE_DIR)")
    seed.add_argument("--pack", metavar="NAME", help="the pack (default: JAXCACHE_PACK)")
    seed.add_argument("--local-dir", metavar="DIR",
                      help="the node-local tier's directory, as the job names it (default: JAXCACHE_LOCAL_DIR, else"
                           " the job's default for the root); its trust policy's subdirectory is seeded")
    seed.add_argument("--verify", choices=("off", "sample", "attested", "signed"),
                      help="the job's verify mode, which names the subdirectory (default: JAXCACHE_VERIFY, else off);"
                           " signed admits only entries a key of JAXCACHE_TRUSTED_KEYS signed in the pack")
    seed.add_argument("--max-size", type=_size, metavar="SIZE",
                      help="the tier's cap, as the job's max_size_bytes (default 16GiB): admission evicts to it")
    seed.add_argument("--watch", type=_duration, metavar="DURATION",
                      help="keep the tier seeded: look at the pack again every DURATION (e.g. 5m), seeding each new"
                           " version, until stopped")
    seed.add_argument("--json", action="store_true", help="each outcome as one line of JSON")
    parser.set_defaults(run=run)


def _size(text: str) -> int:
    return as_argument(parse_bytes, text)


def _duration(text: str) -> float:
    seconds = as_argument(parse_duration, text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text}: give an interval above 0, like 5m")
    return seconds


def run(args: argparse.Namespace) -> int:
    """Seed once, or keep seeding (``--watch``)."""
    from jaxcache.client import options as opts
    from jaxcache.client.pack_seed import CURRENT, SEEDED
    from jaxcache.client.tier_dir import open_local_dir

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    options = opts.resolve(args.root, job="jaxcache-tier-seed", min_compile_time_secs=None,
                           min_entry_size_bytes=None, xla_caches=None, max_size_bytes=args.max_size,
                           service_url=None, token=None, trust="strict", default_xla_caches=None,
                           verify=args.verify, local_dir=args.local_dir, pack=args.pack)
    if options.pack is None:
        raise InvalidInputError("name the pack to seed from: --pack NAME, or JAXCACHE_PACK")
    root = functools.cache(lambda: _open(options.cache_dir))
    policy = _policy(options, root)
    directory = open_local_dir(options, policy)
    if directory is None:
        raise InvalidInputError(f"no node-local directory can be written here (tried {', '.join(options.local_dirs)})")
    seed = _seeder(options, policy, directory, root)
    last: tuple[str, str | None] | None = None
    while True:
        done = seed()
        said = (done["outcome"], done.get("version"))
        if args.watch is None or said != last:  # --watch: a line when something changed
            print(json.dumps(done, sort_keys=True) if args.json else done["text"], flush=True)
        last = said
        if args.watch is None:
            return EXIT_OK if done["outcome"] in (CURRENT, SEEDED) else EXIT_NOT_SEEDED
        time.sleep(args.watch)


def _open(cache_dir: str) -> Any:
    from jaxcache.storage import open_storage

    return open_storage(cache_dir, must_exist=False)


def _policy(options: Any, root: Callable[[], Any]) -> Any:
    """The job's load policy, as its start makes it: it names the tier's subdirectory, and judges what is admitted."""
    from jaxcache.client import verify

    if options.verify == "signed":
        return verify.signed_policy(root, options.trusted_keys)
    if options.verify == "attested":  # the service's verdicts; one that cannot be asked: the unchecked directory
        return verify.attested_policy(options.service_url, options.token, options.cache_dir)
    return None


def _seeder(options: Any, policy: Any, directory: str, root: Callable[[], Any]) -> Callable[[], dict[str, Any]]:
    """One look at the pack (seeding where needed) per call, on one tier; what it found, in words and fields."""
    from jaxcache.client.local_tier import LocalTier
    from jaxcache.client.options import DEFAULT_LOCAL_MAX_BYTES
    from jaxcache.client.pack_seed import ABSENT, CURRENT, REFUSED, SEEDED, PackSeeder
    from jaxcache.client.root_calls import RootCalls

    max_bytes = options.max_size_bytes or DEFAULT_LOCAL_MAX_BYTES
    calls = RootCalls(root, deadline_s=options.lookup_deadline_s, url=options.cache_dir)
    tier = LocalTier(directory, calls, policy=policy, refused=lambda _key, _why: None, max_size_bytes=max_bytes)

    def seed() -> dict[str, Any]:
        seeder = PackSeeder(tier, options.pack, trusted=options.trusted_keys, workers=options.prefetch or 1,
                            max_bytes=max_bytes, say=False)
        started = time.monotonic()
        with _bytes_shown(seeder) as shown_bytes:
            outcome = seeder.run(on_bytes=shown_bytes)
        info = seeder.info
        version = None if info is None else info.version or f"{info.size_bytes} bytes, mtime {info.mtime_s:.0f}"
        name, where = shown(options.pack), f"{shown(options.cache_dir)}/{seeder.object_name}"
        why = shown(seeder.why)
        text = {
            SEEDED: f"seeded {directory} with {seeder.seeded} entries of pack {name}"
                    f" ({format_bytes(seeder.seeded_bytes)}) from {where} in {time.monotonic() - started:.1f} s",
            CURRENT: f"{directory} holds pack {name} as it is now ({where}): nothing read",
            ABSENT: f"no pack {name} in {shown(options.cache_dir)} ({where}): publish one with `jaxcache bundle export"
                    f" ROOT --job JOB --pack {name}` or `warmup ... --pack {name}`",
            REFUSED: f"pack {name} ({where}) refused whole: {why}; nothing of it is in {directory}",
        }.get(outcome, f"pack {name} not read from {where}: {why}")
        return {"outcome": outcome, "pack": options.pack, "object": where, "version": version,
                "directory": directory, "entries": seeder.seeded, "bytes": seeder.seeded_bytes, "why": seeder.why,
                "text": text}

    return seed


@contextlib.contextmanager
def _bytes_shown(seeder: Any) -> Iterator[Callable[[int], None] | None]:
    """A byte counter on stderr while a pack is read, on a terminal only (tqdm)."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    bars: list[Any] = []

    def shown_bytes(n: int) -> None:
        if not bars:
            size = None if seeder.info is None else seeder.info.size_bytes
            bars.append(tqdm(total=size, desc=f"reading pack {seeder.name}", unit="B", unit_scale=True, leave=False,
                             file=sys.stderr, mininterval=0.2))
        bars[0].update(n)

    try:
        yield shown_bytes
    finally:
        for bar in bars:
            bar.close()


COMMAND = Command("tier", "the node-local tier: seed it from a pack in the root (docs/user-guide.md, \"Packs\")",
                  configure=configure, run=run,
                  description="The node-local tier a job's JAX reads (docs/user-guide.md, \"The node-local tier\").")
