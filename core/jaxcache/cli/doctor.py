"""``jaxcache doctor``: decompress every entry and explain what is wrong; ``--verify`` judges integrity."""

from __future__ import annotations

import argparse
import time
from typing import Any

from jaxcache.cli.output import EXIT_OK, EXIT_PROBLEMS, ROOT_HELP, flag_value, json_name, print_json, progress
from jaxcache.display import shown
from jaxcache.doctor import Diagnosis, check, diagnose
from jaxcache.scan import Entry, scan
from jaxcache.storage import Storage
from jaxcache.table import render
from jaxcache.units import parse_duration, plural


def _doctor_json(storage: Storage, d: Diagnosis) -> dict[str, Any]:
    return {
        "root": storage.url,
        "checked": d.stats.entries,
        "ok": d.stats.entries - d.stats.corrupt,
        "corrupt": [{"name": f.name, "key": f.key, "reason": f.reason} for f in d.corrupt],
        "orphans": [{"name": f.name, "key": f.key} for f in d.orphans],
        "skipped": [{"name": json_name(f.name), "reason": f.reason} for f in d.skipped],
        "skipped_total": d.skipped_total,
        "compression": dict(sorted(d.stats.by_compression.items())),
        "mixed_compression": d.stats.mixed_compression,
        "advice": d.advice,
        "problems": d.problems,
    }


def cmd_verify(args: argparse.Namespace, storage: Storage) -> int:
    """``doctor --verify``: classify every entry's integrity against its writer's digest and embedded name."""
    from jaxcache import attestations as att
    from jaxcache import integrity

    min_age_s = flag_value("--min-age", parse_duration, args.min_age) or 0.0
    found = att.load(storage)
    attestations = found.by_key
    entries = (r for r in scan(storage, read_headers=False) if isinstance(r, Entry))
    verdicts = list(progress(integrity.verify(storage, entries, attestations, now=time.time(),
                                              min_age_s=min_age_s), "verifying"))
    counts = {c: sum(v.classification == c for v in verdicts) for c in integrity.CLASSES}
    bad = [v for v in verdicts if v.classification in integrity.BAD_CLASSES]
    if args.json:
        print_json({
            "root": storage.url, "checked": len(verdicts), "counts": counts, "attested_keys": len(attestations),
            "entries": [{"name": v.name, "key": v.key, "class": v.classification, "classes": list(v.classes),
                         "reasons": list(v.reasons), "sha256": v.sha256, "embedded_module": v.embedded_module,
                         "attested_by": v.attested_by, "signature": v.signature} for v in verdicts],
            "conflicts": [{"key": key, "counted": attestations[key].sha256,
                           "others": [{"sha256": o.sha256, "writer": o.writer, "source": o.source, "record": o.record}
                                      for o in others]}
                          for key, others in sorted(found.conflicts.items())],
            "skipped_records": [{"record": name, "error": why} for name, why in sorted(found.skipped.items())],
            "skipped": [{"name": json_name(name), "reason": why} for name, why in storage.skipped.items()],
            "skipped_total": storage.skipped.count,
            "problems": bool(bad),
        })
        return EXIT_PROBLEMS if bad else EXIT_OK
    shown = ", ".join(f"{n} {c}" for c, n in counts.items() if n)
    signed_badly = sum(v.signature is not None for v in verdicts)
    also = f"; {plural(signed_badly, 'entry')} with a bad signature beside it" if signed_badly else ""
    print(f"verified {plural(len(verdicts), 'entry')} in {storage.url}: {shown or 'none'}{also}")
    # An entry whose class is fine is listed too when a signature beside it is bad: someone wrote that there.
    flagged = [v for v in verdicts
               if v.classification not in (integrity.OK, integrity.UNATTESTED) or v.signature is not None]
    if flagged:
        print(render(["CLASS", "FILE", "WHY"], [[", ".join(filter(None, (v.classification, v.signature))), v.name,
                                                 "; ".join(v.reasons)] for v in flagged]))
    if bad:
        print("\nnote: JAX executes what it loads: delete these before jobs load them (`jaxcache prune ROOT "
              "--integrity --apply` removes the proven ones; `--integrity tampered,mismatched,differs,corrupt` "
              "also those that only differ from an unsigned digest), and find out who "
              "could write them.")
    if signed_badly:
        print("\nnote: a bad signature (malformed, for another key, or claiming a trusted key and not verifying)"
              " proves nothing, and the entry's class is what its bytes prove; someone who could write the root put"
              " it there. Find out who, then remove the <key>-sig and sign the entry again (`jaxcache keys sign ROOT"
              " --key K`), or remove the entry.")
    if found.conflicts:
        n = len(found.conflicts)
        print(f"\nnote: {plural(n, 'entry')} {'has' if n == 1 else 'have'} more than one recorded digest; the first"
              " counted, the others are listed with --json (a second writer raced the first, or a record was forged)")
    if found.skipped:
        first, why = min(found.skipped.items())
        print(f"\nnote: skipped {plural(len(found.skipped), 'malformed run or warm-up record')} (their digests are"
              f" not used); the first: {first}: {why}")
    if storage.skipped.count:
        print(f"\nnote: skipped {plural(storage.skipped.count, 'object')} named like entries or records that are not"
              " regular files, whose names cannot be read safely, or that are stored with a Content-Encoding;"
              " `jaxcache doctor ROOT` lists them")
    if counts[integrity.UNATTESTED]:
        n = counts[integrity.UNATTESTED]
        print(f"\nnote: {plural(n, 'entry')} {'has' if n == 1 else 'have'} no recorded digest (written by plain JAX,"
              " not through jaxcache.client or warmup); only their embedded name could be checked.")
    return EXIT_PROBLEMS if bad else EXIT_OK


def cmd_doctor(args: argparse.Namespace, storage: Storage) -> int:
    if args.verify:
        return cmd_verify(args, storage)
    d = diagnose(progress(check(storage), "checking"), storage.skipped)
    exit_code = EXIT_PROBLEMS if d.problems else EXIT_OK
    if args.json:
        print_json(_doctor_json(storage, d))
        return exit_code
    s = d.stats
    mix = ", ".join(f"{k} {v}" for k, v in sorted(s.by_compression.items())) or "-"
    print(f"checked {plural(s.entries, 'entry')} in {storage.url}: {s.entries - s.corrupt} ok, {s.corrupt} corrupt, "
          f"{plural(s.orphans, 'orphaned -atime file')}; compression: {mix}"
          + (f"; {d.skipped_total} skipped" if d.skipped_total else ""))
    if d.corrupt:
        print(f"\ncorrupt entries ({len(d.corrupt)}):")
        print(render(["FILE", "REASON"], [[f.name, f.reason] for f in d.corrupt]))
    if d.orphans:
        print(f"\norphaned -atime files ({len(d.orphans)}):")
        print("\n".join(shown(f.name) for f in d.orphans))
    if d.skipped:
        more = f", the first {len(d.skipped)} shown" if d.skipped_total > len(d.skipped) else ""
        print(f"\nskipped, not read ({d.skipped_total}{more}):")
        print(render(["NAME", "WHY"], [[f.name, f.reason] for f in d.skipped]))
    for note in d.advice:
        print(f"\nnote: {note}")
    if not d.problems:
        print("no problems found")
    return exit_code


def add_parser(sub: Any) -> None:
    """``doctor``."""
    dr = sub.add_parser("doctor", help="validate every entry and explain what is wrong",
                        description="Decompress every entry, list corrupt ones with the reason, list orphaned "
                                    "-atime files, and explain mixed compression. Exits 1 if anything needs "
                                    "attention.")
    dr.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    dr.add_argument("--verify", action="store_true",
                    help="integrity: compare each entry with its signatures (<key>-sig), its writer's recorded "
                         "digest and its embedded program name; classes ok, tampered (differs from what a key of "
                         "JAXCACHE_TRUSTED_KEYS signed: proof), differs (from an unsigned digest: a record or a "
                         "report, not proof), mismatched, corrupt (including one that expands to more than "
                         "JAXCACHE_MAX_DECOMPRESSED_BYTES, default 4GiB), pending (younger than --min-age), unattested")
    dr.add_argument("--min-age", default="1h", metavar="DURATION",
                    help="with --verify: entries younger than this that look broken are pending (default 1h; a "
                         "unit is needed: 45s, 30m, 12h, 14d, 2w)")
    dr.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    dr.set_defaults(run=cmd_doctor)
