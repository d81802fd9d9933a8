"""``jaxcache keys new NAME`` and ``jaxcache keys sign ROOT --key K``: signing keys, and signing what a root holds."""

from __future__ import annotations

import argparse
import hashlib
import sys
from typing import Any

from jaxcache import signing
from jaxcache.cli.output import EXIT_OK, EXIT_PROBLEMS, ROOT_HELP, print_json
from jaxcache.errors import InvalidInputError, NotRegularFileError
from jaxcache.parallel import bounded_map
from jaxcache.scan import Entry, scan
from jaxcache.storage import Storage
from jaxcache.storage.named import check_named, spelled
from jaxcache.units import plural


def cmd_new(args: argparse.Namespace, storage: Storage | None) -> int:
    """Write a private key file (0600) and print its public key."""
    path = spelled(args.out or f"{args.name}.key")  # as named: `..` after a link is the link target's parent
    check_named(path, "--out")  # a link another user owns on the way would choose where the key goes
    key = signing.new_key(args.name, path)
    print(f"private key written to {path} (mode 0600): give it to writers as {signing.SIGNING_KEY_ENV}={path}",
          file=sys.stderr)
    print(key.public_text())
    return EXIT_OK


def _digest(storage: Storage, name: str) -> tuple[str, int] | None:
    try:
        chunks = storage.read_chunks(name)
    except NotRegularFileError:
        return None
    if chunks is None:
        return None
    digest, size = hashlib.sha256(), 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _sign_one(storage: Storage, key: signing.SigningKey, trusted: signing.TrustedKeys, recorded: dict[str, str] | None,
              old_keys: frozenset[str], dry_run: bool, entry: Entry) -> tuple[str, str]:
    """``(outcome, why)`` for one entry: ``signed``, or ``skipped`` with why."""
    found = _digest(storage, entry.name)
    if found is None:
        return "skipped", "gone since the listing"
    sha, size = found
    if recorded is not None and recorded.get(entry.key) != sha:
        why = "no record names a digest" if entry.key not in recorded else "differs from its recorded digest"
        return "skipped", why
    if old_keys:
        prior = [s for s in signing.read(storage, entry.key, trusted).trusted if s.signer in old_keys]
        if not any(s.sha256 == sha and s.size_bytes == size for s in prior):
            return "skipped", ("not signed by " + ", ".join(sorted(old_keys)) if not prior
                               else "its bytes differ from what the old key signed (tampered): not re-signed")
    try:
        if dry_run:
            signing.read_object(storage, entry.key)  # what signing reads first: it refuses what is no file
        else:
            signing.add(storage, key.sign(entry.key, sha, size, writer=f"jaxcache keys sign by {key.name}"))
    except NotRegularFileError:  # a FIFO, folder or link planted as the -sig: never opened, nor replaced
        return "skipped", f"its {signing.sig_name(entry.key)} is not a regular file: left as it is (remove it, then" \
                          " sign again)"
    return "signed", ""


def cmd_sign(args: argparse.Namespace, storage: Storage | None) -> int:
    """Sign every entry a root holds now (or only those a record or an old trusted key vouches for)."""
    assert storage is not None
    key = signing.load_key(args.key)
    trusted = signing.TrustedKeys.from_env()
    old_keys = frozenset(n for item in (args.if_signed_by or []) for n in item.split(",") if n)
    missing = sorted(old_keys - set(trusted.keys))
    if missing:
        raise InvalidInputError(f"--if-signed-by {', '.join(missing)}: not in {signing.TRUSTED_KEYS_ENV}; only a"
                                " trusted key's signatures can be carried over")
    recorded = None
    if args.if_recorded:
        from jaxcache.attestations import load

        recorded = {k: a.sha256 for k, a in load(storage).by_key.items()}
    entries = [r for r in scan(storage, read_headers=False) if isinstance(r, Entry)]
    work = lambda e: _sign_one(storage, key, trusted, recorded, old_keys, args.dry_run, e)  # noqa: E731
    outcomes = list(bounded_map(work, entries, workers=storage.io_workers))
    signed = [e.key for e, (o, _) in zip(entries, outcomes, strict=True) if o == "signed"]
    skipped = [(e.key, why) for e, (o, why) in zip(entries, outcomes, strict=True) if o != "signed"]
    if args.json:
        print_json({"root": storage.url, "key": key.name, "dry_run": args.dry_run, "signed": signed,
                    "skipped": [{"key": k, "why": why} for k, why in skipped]})
    else:
        verb = "would sign" if args.dry_run else "signed"
        print(f"{verb} {len(signed)} of {plural(len(entries), 'entry')} in {storage.url} with {key.name}"
              + (f"; {len(skipped)} skipped" if skipped else ""))
        for k, why in skipped[:20]:
            print(f"  skipped {k}: {why}")
        if not args.dry_run and signed:
            print(f"readers trust it once {signing.TRUSTED_KEYS_ENV} lists {key.public_text()}")
    return EXIT_PROBLEMS if any("tampered" in why for _, why in skipped) else EXIT_OK


def add_parsers(sub: Any) -> None:
    """``keys new`` and ``keys sign``."""
    keys = sub.add_parser("keys", help="signing keys: make one, sign what a root holds"
                                       " (docs/user-guide.md, \"Integrity\")",
                          description="Ed25519 signing keys, as Nix's binary caches use them: writers sign each entry"
                                      f" with a private key file ({signing.SIGNING_KEY_ENV}), readers trust public"
                                      f" keys ({signing.TRUSTED_KEYS_ENV}).")
    ks = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    new = ks.add_parser("new", help="write a private key file (mode 0600) and print its public key as NAME:base64")
    new.add_argument("name", metavar="NAME", help="the key's name, e.g. ci-2026 (letters, digits, '.', '_', '-')")
    new.add_argument("--out", metavar="PATH", help="where to write the private key (default ./NAME.key; never"
                                                   " overwritten)")
    new.set_defaults(run=cmd_new, root=None)
    sign = ks.add_parser("sign", help="sign the entries a root holds now with --key (an operator's deliberate act)",
                         description="Sign every entry as it is now, or only those whose bytes match a record's"
                                     " digest (--if-recorded) or an old trusted key's signature (--if-signed-by:"
                                     " rotation, so a key can be retired without a cold cache). Signatures go"
                                     " beside the entries (<key>-sig), kept alongside any other key's.")
    sign.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    sign.add_argument("--key", required=True, metavar="PATH", help="the private key file to sign with")
    sign.add_argument("--if-recorded", action="store_true",
                      help="only entries whose bytes match the digest a run or warm-up record names")
    sign.add_argument("--if-signed-by", action="append", metavar="NAME",
                      help=f"only entries whose bytes a key of {signing.TRUSTED_KEYS_ENV} with this name signed;"
                           " repeat or comma-separate")
    sign.add_argument("--dry-run", action="store_true", help="say what would be signed; write nothing")
    sign.add_argument("--json", action="store_true", help="signed keys and skipped ones with why, as JSON")
    sign.set_defaults(run=cmd_sign)
