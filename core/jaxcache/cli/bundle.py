"""``jaxcache bundle export ROOT --job NAME -o FILE`` (or ``--pack NAME``: published into the root) and ``jaxcache
bundle import FILE ROOT``: a job's working set as one archive, checked when it comes back (docs/user-guide.md,
"Bundles")."""

from __future__ import annotations

import argparse
import os
from typing import Any

from jaxcache import packs, signing
from jaxcache.bundle import export
from jaxcache.bundle_import import add_checked, check_archive
from jaxcache.cli.output import EXIT_OK, EXIT_PROBLEMS, ROOT_HELP, non_negative, not_recorded, print_json, progress
from jaxcache.display import shown
from jaxcache.errors import InvalidInputError
from jaxcache.reach import answering
from jaxcache.storage import LocalStorage, Storage, open_named_root
from jaxcache.storage.named import check_named
from jaxcache.units import format_bytes
from jaxcache.working_set import DEFAULT_DAYS, DEFAULT_RUNS, Wanted, from_root

_SHOWN = 20


def _listed(what: str, found: dict[str, str]) -> list[str]:
    lines = [f"  {what} {shown(key)}: {shown(why)}" for key, why in list(found.items())[:_SHOWN]]
    return lines + ([f"  ... and {len(found) - _SHOWN} more"] if len(found) > _SHOWN else [])


def cmd_export(args: argparse.Namespace, storage: Storage | None) -> int:
    """Write the job's working set as a bundle."""
    assert storage is not None
    if args.runs < 1 or args.days < 1:
        raise InvalidInputError("--runs and --days must be 1 or more")
    wanted = Wanted(jaxlib=args.jaxlib, backend=args.backend, device_kind=args.device_kind,
                    device_count=args.device_count)
    if args.pack is not None:
        packs.object_name(args.pack)  # a bad name: one line, before anything is read
    else:  # before anything is read: a link another user owns on the way is not followed
        check_named(args.out, "--out")
    working = from_root(storage, args.job, wanted, runs=args.runs, days=args.days)
    if not working.keys:
        from jaxcache.explain.from_root import read_root

        named = read_root(storage).jobs
        if args.job not in named:  # a typo: name the recorded jobs closest to it, as `explain --job` does
            raise InvalidInputError(not_recorded("--job", args.job, named, "job", storage.url))
        raise InvalidInputError(f"no working set for job {args.job!r} in {storage.url}: no run (process 0) or warm-up"
                                f" of it within {args.days} days matches the fingerprint asked for; nothing written")
    published = None
    if args.pack is not None:
        published = packs.publish_set(storage, working, args.pack, progress=progress)
        done = published.exported
    else:
        done = export(storage, working, args.out, progress=progress)
    left = {x.key: x.why for x in done.left_out}
    signed = sum(i.signature for i in done.manifest.entries)
    info = None if published is None else published.info
    where = done.path if info is None else f"{storage.url}/{info.name}"
    if args.json:
        print_json({"path": None if info is not None else done.path, "size_bytes": done.size_bytes,
                    "job": working.job, "keys": [i.key for i in done.manifest.entries], "signed": signed,
                    "left_out": [{"key": k, "why": w} for k, w in left.items()],
                    **({} if args.pack is None else {"pack": args.pack, "object": where,
                                                      "version": None if info is None else info.version})})
    elif done.path is None:
        print("\n".join([f"nothing written: none of the {len(working.keys)} keys of job {working.job!r} could be"
                         " exported", *_listed("left out", left)]))
    else:
        what = "wrote" if info is None else f"published pack {shown(args.pack)} as"
        version = "" if info is None or info.version is None else f" (version {shown(info.version)})"
        print("\n".join([f"{what} {shown(str(where))}{version} ({format_bytes(done.size_bytes)}):"
                         f" {done.manifest.described()}; {signed} signed" + (f"; {len(left)} left out" if left else ""),
                         *_listed("left out", left)]))
    return EXIT_OK if done.path is not None else EXIT_PROBLEMS


def cmd_import(args: argparse.Namespace, storage: Storage | None) -> int:
    """Check a bundle and add what passes to a root, create-only."""
    root = answering(open_named_root(args.dest, must_exist=False))  # a store that does not answer: one line, now
    checked = check_archive(args.bundle, signing.TrustedKeys.from_env(), progress=progress)  # before any write
    if isinstance(root, LocalStorage) and not os.path.isdir(root.root):
        try:
            os.makedirs(root.root)
        except OSError as exc:
            raise InvalidInputError(f"cannot create the cache root {root.root}: {exc.strerror}") from None
    done = add_checked(checked, root, progress=progress)
    if args.json:
        print_json({"root": root.url, **done.to_json()})
    else:
        lines = [done.check_text(), f"bundle: {done.manifest.described()}",
                 f"into {root.url}: {len(done.imported)} imported, {len(done.present)} already there,"
                 f" {len(done.kept)} left alone (other bytes there), {len(done.refused)} refused"
                 + (f", {len(done.signatures_kept)} without this bundle's signature (another there)"
                    if done.signatures_kept else "")]
        lines += (_listed("refused", done.refused) + _listed("left alone", done.kept)
                  + _listed("signature not placed for", done.signatures_kept))
        lines += [f"  note: {n}" for n in done.notes[:_SHOWN]]
        print("\n".join(lines))
    return EXIT_OK if done.whole else EXIT_PROBLEMS


_EXPORT_DESCRIPTION = (
    "Write a job's working set (the keys its newest matching runs hit or wrote, and its warm-ups' coverage) as one"
    " uncompressed tar: manifest.json first (job, fingerprint: jaxlib, backend, devices; each key's sha256 and size),"
    " then each <key>-cache and its <key>-sig. An entry that is gone, differs from the digest its writer recorded or"
    " does not decompress is left out and named. With --pack NAME the archive is published into ROOT instead, as"
    " the pack NAME (.jaxcache/packs/NAME.tar, replaced whole: a new release): a fleet's nodes read it in a few"
    " large ranged reads instead of a request per entry. Exit codes: 0 written (published); 1 no key could be"
    " exported (nothing written); 2 bad input, or no run or warm-up of the job matches (nothing to export: a wrong"
    " --job or filter).")
_IMPORT_DESCRIPTION = (
    "Check a bundle and add its entries to ROOT, create-only. With JAXCACHE_TRUSTED_KEYS set, an entry is imported"
    " only with a signature by one of those keys over its bytes (others are refused: unsigned, untrusted key, bad"
    " signature, digest differs); without, only the manifest's digests are checked, which proves the archive is"
    " whole, not who made it; the output says which. Every entry must decompress whole, to at most"
    " JAXCACHE_MAX_DECOMPRESSED_BYTES (default 4GiB; more is refused as a decompression bomb). The archive is checked"
    " whole before anything is written: a member that is not <key>-cache or <key>-sig listed by the manifest (a"
    " path, a link), or an archive cut short, refuses it all. An object already in ROOT is never replaced. Exit"
    " codes: 0 every entry is in ROOT now (imported or already there) with its signature; 1 some were refused,"
    " other bytes were there, or another <key>-sig was there so the bundle's signature was not placed (each named);"
    " 2 bad input or a refused archive (nothing written).")


def add_parsers(sub: Any) -> None:
    """``bundle export`` and ``bundle import``."""
    bundle = sub.add_parser("bundle", help="a job's working set as one archive: export it, import it checked"
                                           " (docs/user-guide.md, \"Bundles\")",
                            description="Carry a job's working set as one archive: to bake a cache into an image or"
                                        " take it to an air-gapped cluster. `warmup --check --cache-dir FILE` checks"
                                        " a bundle as it would a root.")
    bs = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")
    ex = bs.add_parser("export", help="write a job's working set as a bundle", description=_EXPORT_DESCRIPTION)
    ex.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    ex.add_argument("--job", required=True, metavar="NAME", help="the job whose working set to export")
    to = ex.add_mutually_exclusive_group(required=True)
    to.add_argument("-o", "--out", metavar="FILE",
                    help="the archive to write (written beside it first, then renamed: replaced only when whole)")
    to.add_argument("--pack", metavar="NAME",
                    help="publish it into ROOT as the pack NAME (.jaxcache/packs/NAME.tar, replaced whole), which"
                         " jobs naming the pack (JAXCACHE_PACK) and `jaxcache tier seed` read in a few large ranged"
                         " reads (docs/user-guide.md, \"Packs\")")
    ex.add_argument("--runs", type=non_negative, default=DEFAULT_RUNS, metavar="N",
                    help=f"the job's newest N matching runs (default {DEFAULT_RUNS})")
    ex.add_argument("--days", type=non_negative, default=DEFAULT_DAYS, metavar="N",
                    help=f"only runs and warm-ups of the last N days (default {DEFAULT_DAYS})")
    ex.add_argument("--jaxlib", metavar="VERSION", help="only runs on this jaxlib (default: the newest run's)")
    ex.add_argument("--backend", metavar="NAME", help="only runs on this backend, e.g. gpu, tpu, cpu")
    ex.add_argument("--device-kind", metavar="KIND", help="only runs on this device kind, e.g. 'NVIDIA H100 80GB HBM3'")
    ex.add_argument("--device-count", type=non_negative, metavar="N", help="only runs with this many devices")
    ex.add_argument("--json", action="store_true", help="what was written and what was left out, as JSON")
    ex.set_defaults(run=cmd_export)
    im = bs.add_parser("import", help="check a bundle and add it to a root, create-only",
                       description=_IMPORT_DESCRIPTION)
    im.add_argument("bundle", metavar="FILE", help="a bundle written by `jaxcache bundle export`")
    im.add_argument("dest", metavar="ROOT", help=ROOT_HELP + " (a directory is created if missing)")
    im.add_argument("--json", action="store_true", help="imported, already there, left alone and refused, as JSON")
    im.set_defaults(run=cmd_import, root=None)
