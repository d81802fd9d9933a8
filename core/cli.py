"""The ``jaxcache`` command: the one composition root that wires storage, scanning and output together.

Exit codes: 0 ok, 1 problems found (``doctor``), 2 usage or input error.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import heapq
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from jaxcache import __version__
from jaxcache.doctor import Diagnosis, check, diagnose
from jaxcache.errors import InvalidInputError, JaxcacheError, MissingDependencyError
from jaxcache.prune import CORRUPT_REASON, Candidate, Decision, PrunePlan, PrunePolicy, PruneResult, apply, plan
from jaxcache.scan import Entry, Record, scan
from jaxcache.stats import CacheStats, summarize
from jaxcache.storage import Storage, open_storage
from jaxcache.table import render
from jaxcache.units import format_bytes, format_duration, parse_bytes, parse_duration
from jaxcache.usage import RecordedUse, read_usage

T = TypeVar("T")

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2

_SORTS: dict[str, tuple[Callable[[Entry], Any], bool]] = {
    # name: (key, largest-first)
    "size": (lambda e: e.size_bytes, True),
    "compile": (lambda e: -1 if e.compile_seconds is None else e.compile_seconds, True),
    "age": (lambda e: e.mtime_s, False),  # oldest first
    "name": (lambda e: e.key, False),
}

_ROOT_HELP = "cache root: a directory, file:///path, or gs://bucket/prefix"


def _progress(items: Iterable[T], what: str) -> Iterator[T]:
    """Count records on stderr while a long scan runs; silent unless stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=what, unit=" entries", leave=False, file=sys.stderr, mininterval=0.2)


def _entry_json(e: Entry) -> dict[str, Any]:
    return {
        "key": e.key,
        "function": e.module,
        "hash": e.hash,
        "size_bytes": e.size_bytes,
        "compression": e.compression.value if e.compression else None,
        "compile_seconds": e.compile_seconds,
        "status": e.status.value if e.status else None,
        "reason": e.reason,
        "created_s": e.mtime_s,
        "last_used_s": e.last_used_s,
        "has_atime": e.atime_ns is not None,
    }


def _select(records: Iterable[Record], function: str | None) -> Iterator[Entry]:
    for r in records:
        if isinstance(r, Entry) and (function is None or fnmatch.fnmatchcase(r.module, function)):
            yield r


def cmd_ls(args: argparse.Namespace, storage: Storage) -> int:
    entries = _select(_progress(scan(storage), "scanning"), args.function)
    key, largest_first = _SORTS[args.sort]
    if args.limit is not None:
        pick = heapq.nlargest if largest_first else heapq.nsmallest
        chosen = pick(args.limit, entries, key=key)
    else:
        chosen = sorted(entries, key=key, reverse=largest_first)
    if args.json:
        json.dump({"root": storage.url, "entries": [_entry_json(e) for e in chosen]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    now = time.time()
    rows = [
        [
            e.module,
            e.hash[:12],
            format_bytes(e.size_bytes),
            "?" if e.compile_seconds is None else f"{e.compile_seconds} s",
            format_duration(now - e.mtime_s),
            format_duration(now - e.last_used_s) if e.atime_ns is not None else "-",
            e.compression.value if e.compression else "?",
            e.status.value if e.status else "?",
        ]
        for e in chosen
    ]
    headers = ["FUNCTION", "HASH", "SIZE", "COMPILE", "AGE", "LAST USED", "COMPRESSION", "STATUS"]
    print(render(headers, rows, right=frozenset({2, 3, 4, 5})))
    print(f"{len(rows)} entries, {format_bytes(sum(e.size_bytes for e in chosen))} in {storage.url}")
    return EXIT_OK


def _stats_json(storage: Storage, s: CacheStats) -> dict[str, Any]:
    return {
        "root": storage.url,
        "entries": s.entries,
        "size_bytes": s.size_bytes,
        "compile_seconds": s.compile_seconds,
        "with_atime": s.with_atime,
        "compression": dict(sorted(s.by_compression.items())),
        "mixed_compression": s.mixed_compression,
        "corrupt": s.corrupt,
        "orphans": s.orphans,
        "orphan_bytes": s.orphan_bytes,
        "oldest_created_s": s.oldest_mtime_s,
        "newest_created_s": s.newest_mtime_s,
        "by_function": [
            {"function": name, "entries": f.entries, "size_bytes": f.size_bytes, "compile_seconds": f.compile_seconds}
            for name, f in sorted(s.by_function.items(), key=lambda kv: (-kv[1].size_bytes, kv[0]))
        ],
    }


def cmd_stats(args: argparse.Namespace, storage: Storage) -> int:
    s = summarize(_progress(scan(storage), "scanning"))
    data = _stats_json(storage, s)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    now = time.time()
    mix = ", ".join(f"{k} {v}" for k, v in sorted(s.by_compression.items())) or "-"
    summary = [
        ["root", storage.url],
        ["entries", f"{s.entries} ({s.with_atime} with an -atime record)"],
        ["size", format_bytes(s.size_bytes)],
        ["compile time stored", f"{s.compile_seconds} s (JAX stores whole seconds; most small programs store 0)"],
        ["compression", mix],
        ["corrupt (header check)", f"{s.corrupt}" + (" - run `jaxcache doctor` for details" if s.corrupt else "")],
        ["orphaned -atime files", f"{s.orphans} ({format_bytes(s.orphan_bytes)})"],
    ]
    if s.oldest_mtime_s is not None and s.newest_mtime_s is not None:
        summary.append(["oldest / newest entry",
                        f"{format_duration(now - s.oldest_mtime_s)} / {format_duration(now - s.newest_mtime_s)} ago"])
    width = max(len(k) for k, _ in summary)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in summary))
    if s.mixed_compression:
        print("\nwarning: both zstd and zlib entries: run `jaxcache doctor` for what that means")
    top = data["by_function"][: args.top]
    if top:
        print(f"\nby function (top {len(top)} of {len(data['by_function'])} by size):")
        rows = [[f["function"], str(f["entries"]), format_bytes(f["size_bytes"]), f"{f['compile_seconds']} s"]
                for f in top]
        print(render(["FUNCTION", "ENTRIES", "SIZE", "COMPILE"], rows, right=frozenset({1, 2, 3})))
    return EXIT_OK


def _doctor_json(storage: Storage, d: Diagnosis) -> dict[str, Any]:
    return {
        "root": storage.url,
        "checked": d.stats.entries,
        "ok": d.stats.entries - d.stats.corrupt,
        "corrupt": [{"name": f.name, "key": f.key, "reason": f.reason} for f in d.corrupt],
        "orphans": [{"name": f.name, "key": f.key} for f in d.orphans],
        "compression": dict(sorted(d.stats.by_compression.items())),
        "mixed_compression": d.stats.mixed_compression,
        "advice": d.advice,
        "problems": d.problems,
    }


def cmd_verify(args: argparse.Namespace, storage: Storage) -> int:
    """``doctor --verify``: classify every entry's integrity against its writer's digest and embedded name."""
    from jaxcache import integrity

    min_age_s = parse_duration(args.min_age)
    attestations = integrity.load_attestations(storage)
    entries = (r for r in scan(storage, read_headers=False) if isinstance(r, Entry))
    verdicts = list(_progress(integrity.verify(storage, entries, attestations, now=time.time(),
                                               min_age_s=min_age_s), "verifying"))
    counts = {c: sum(v.classification == c for v in verdicts) for c in integrity.CLASSES}
    bad = [v for v in verdicts if v.classification in integrity.BAD_CLASSES]
    if args.json:
        json.dump({
            "root": storage.url, "checked": len(verdicts), "counts": counts, "attested_keys": len(attestations),
            "entries": [{"name": v.name, "key": v.key, "class": v.classification, "classes": list(v.classes),
                         "reasons": list(v.reasons), "sha256": v.sha256, "embedded_module": v.embedded_module,
                         "attested_by": v.attested_by} for v in verdicts],
            "problems": bool(bad),
        }, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_PROBLEMS if bad else EXIT_OK
    shown = ", ".join(f"{n} {c}" for c, n in counts.items() if n)
    print(f"verified {len(verdicts)} entries in {storage.url}: {shown or 'none'}")
    flagged = [v for v in verdicts if v.classification not in (integrity.OK, integrity.UNATTESTED)]
    if flagged:
        print(render(["CLASS", "FILE", "WHY"], [[v.classification, v.name, "; ".join(v.reasons)] for v in flagged]))
    if bad:
        print("\nnote: JAX executes what it loads: delete these before jobs load them "
              "(`jaxcache prune ROOT --corrupt --apply` removes corrupt ones; remove tampered or mismatched files "
              "and find out who could write them).")
    if counts[integrity.UNATTESTED]:
        print(f"\nnote: {counts[integrity.UNATTESTED]} entries have no recorded digest (written by plain JAX, not "
              "through jaxcache.client or warmup); only their embedded name could be checked.")
    return EXIT_PROBLEMS if bad else EXIT_OK


def cmd_doctor(args: argparse.Namespace, storage: Storage) -> int:
    if args.verify:
        return cmd_verify(args, storage)
    d = diagnose(_progress(check(storage), "checking"))
    exit_code = EXIT_PROBLEMS if d.problems else EXIT_OK
    if args.json:
        json.dump(_doctor_json(storage, d), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return exit_code
    s = d.stats
    mix = ", ".join(f"{k} {v}" for k, v in sorted(s.by_compression.items())) or "-"
    print(f"checked {s.entries} entries in {storage.url}: {s.entries - s.corrupt} ok, {s.corrupt} corrupt, "
          f"{s.orphans} orphaned -atime files; compression: {mix}")
    if d.corrupt:
        print(f"\ncorrupt entries ({len(d.corrupt)}):")
        print(render(["FILE", "REASON"], [[f.name, f.reason] for f in d.corrupt]))
    if d.orphans:
        print(f"\norphaned -atime files ({len(d.orphans)}):")
        print("\n".join(f.name for f in d.orphans))
    for note in d.advice:
        print(f"\nnote: {note}")
    if not d.problems:
        print("no problems found")
    return exit_code


_PRUNE_TABLE_ROWS = 50
_NO_RULE = (
    "nothing selects entries: give --max-size, --unused-for, --older-than, --function, --corrupt, --orphans or "
    "--stale-jaxlib (--keep and --min-age only protect entries)"
)


def _flag_value(flag: str, parse: Callable[[str], T], text: str | None) -> T | None:
    """Parse one option's text, naming the option in the one-line error."""
    if text is None:
        return None
    try:
        return parse(text)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{flag}: {exc}") from None


def _prune_policy(args: argparse.Namespace) -> PrunePolicy:
    min_age = _flag_value("--min-age", parse_duration, args.min_age)
    window = _flag_value("--stale-jaxlib-window", parse_duration, args.stale_jaxlib_window)
    if window is not None and not args.stale_jaxlib:
        raise InvalidInputError("--stale-jaxlib-window needs --stale-jaxlib")
    extra = {} if window is None else {"stale_jaxlib_window_s": window}
    return PrunePolicy(
        max_total_bytes=_flag_value("--max-size", parse_bytes, args.max_size),
        unused_for_s=_flag_value("--unused-for", parse_duration, args.unused_for),
        older_than_s=_flag_value("--older-than", parse_duration, args.older_than),
        functions=tuple(args.function or ()),
        corrupt=args.corrupt,
        orphans=args.orphans,
        keep=tuple(args.keep or ()),
        min_age_s=3600.0 if min_age is None else min_age,
        stale_jaxlib=args.stale_jaxlib,
        integrity=tuple(c.strip() for c in (args.integrity or "").split(",") if c.strip()),
        **extra,
    )


def _reasons(d: Decision, details: dict[str, str]) -> list[str]:
    # The plan says "corrupt"; the scan knows what is wrong with the entry.
    detail = details.get(d.candidate.key)
    return [f"{r}: {detail}" if r == CORRUPT_REASON and detail else r for r in d.reasons]


def _records_json(use: RecordedUse | None) -> dict[str, Any] | None:
    if use is None:
        return None  # not read: no rule of the policy is about use
    return {"read": use.records, "malformed": [name for name, _ in use.malformed], "keys_hit": len(use.last_hit_s),
            "keys_with_writer": len(use.writer_jaxlib)}


def _decision_json(d: Decision, details: dict[str, str]) -> dict[str, Any]:
    c = d.candidate
    return {
        "key": c.key,
        "function": c.module,
        "hash": c.key[-64:],
        "name": c.name,
        "size_bytes": c.size_bytes,
        "created_s": c.created_s,
        "last_used_s": c.last_use_s,  # with reported hits, when run records were read
        "status": c.status,
        "orphan": c.orphan,
        "reasons": _reasons(d, details),
    }


def _protected_counts(p: PrunePlan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in p.protected:
        for r in d.reasons:
            counts[r] = counts.get(r, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _apply_with_progress(storage: Storage, p: PrunePlan, verbose: bool) -> PruneResult:
    if verbose:
        def say(d: Decision) -> None:
            print(f"removed {d.candidate.name}", file=sys.stderr, flush=True)

        return apply(storage, p, on_deleted=say)
    if sys.stderr.isatty() and p.delete:
        from tqdm import tqdm

        with tqdm(total=len(p.delete), desc="deleting", unit=" entries", leave=False, file=sys.stderr,
                  mininterval=0.2) as bar:
            return apply(storage, p, on_deleted=lambda _: bar.update())
    return apply(storage, p)


def _print_prune_plan(p: PrunePlan, details: dict[str, str], now: float) -> None:
    shown = p.delete[:_PRUNE_TABLE_ROWS]
    if shown:
        rows = [
            [
                d.candidate.module,
                d.candidate.key[-64:][:12],
                format_bytes(d.candidate.size_bytes),
                format_duration(now - d.candidate.last_use_s),
                "; ".join(_reasons(d, details)),
            ]
            for d in shown
        ]
        print(render(["FUNCTION", "HASH", "SIZE", "LAST USED", "REASONS"], rows, right=frozenset({2, 3})))
        if len(p.delete) > len(shown):
            print(f"... and {len(p.delete) - len(shown)} more")
    counts = _protected_counts(p)
    if counts:
        print(f"\nprotected: {len(p.protected)} selected entries kept")
        width = max(len(str(n)) for n in counts.values())
        print("\n".join(f"  {str(n).rjust(width)}  {reason}" for reason, n in counts.items()))


def cmd_prune(args: argparse.Namespace, storage: Storage) -> int:
    policy = _prune_policy(args)
    if not policy.selects_anything():
        raise InvalidInputError(_NO_RULE)
    details: dict[str, str] = {}
    candidates: list[Candidate] = []
    # Run records matter only to rules about use: hits make LRU real where there are no -atime files (GCS).
    use = None
    if policy.stale_jaxlib or policy.max_total_bytes is not None or policy.unused_for_s is not None:
        use = read_usage(storage)
        for name, why in use.malformed[:10]:
            print(f"jaxcache: warning: skipping malformed run record {name}: {why}", file=sys.stderr)
    # Headers (one small read per entry) are needed only to find corrupt entries.
    for record in _progress(scan(storage, read_headers=policy.corrupt), "scanning"):
        if isinstance(record, Entry) and record.reason:
            details[record.key] = record.reason
        c = Candidate.from_record(record)
        candidates.append(use.apply_to(c) if use is not None else c)
    now = time.time()
    if policy.integrity:
        # Read every entry once and judge it against its writer's digest and embedded name.
        from jaxcache import integrity

        attested = integrity.load_attestations(storage)
        scanned = [Entry(key=c.key, module=c.module, hash=c.key[-64:], name=c.name, size_bytes=c.size_bytes,
                         mtime_s=c.created_s, generation=c.generation) for c in candidates if not c.orphan]
        verdicts = {v.key: v for v in _progress(integrity.verify(storage, scanned, attested, now=now,
                                                                 min_age_s=policy.min_age_s), "verifying")}
        candidates = [dataclasses.replace(c, integrity=verdicts[c.key].classification) if c.key in verdicts else c
                      for c in candidates]
        for key, v in verdicts.items():
            if v.classification in integrity.BAD_CLASSES:
                details[key] = "; ".join(v.reasons)
    recent = use.recent_jaxlibs(now - policy.stale_jaxlib_window_s) if use is not None else None
    p = plan(candidates, policy, now=now, recent_jaxlibs=recent)
    del candidates
    if not args.json:
        _print_prune_plan(p, details, now)
        if p.delete or p.protected:
            print()
        for note in p.notes:
            print(f"note: {note}")
    result = _apply_with_progress(storage, p, args.verbose) if args.apply and p.delete else None
    if args.apply and result is None:
        result = PruneResult()
    exit_code = EXIT_PROBLEMS if result is not None and result.errors else EXIT_OK
    if args.json:
        data = {
            "root": storage.url,
            "applied": bool(args.apply),
            "policy": policy.as_dict(),
            "now_s": now,
            "entries_total": p.entries_total,
            "kept": p.kept,
            "bytes_freed": p.bytes_freed,
            "bytes_remaining": p.bytes_remaining,
            "delete": [_decision_json(d, details) for d in p.delete],
            "protected": [_decision_json(d, details) for d in p.protected],
            "protected_by_reason": _protected_counts(p),
            "notes": p.notes,
            "run_records": _records_json(use),
            "result": None if result is None else {
                "deleted": result.deleted,
                "bytes_freed": result.bytes_freed,
                "already_gone": result.already_gone,
                "changed": result.changed,
                "errors": result.errors,
            },
        }
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return exit_code
    if result is None:
        print(f"would delete {len(p.delete)} entries, freeing {format_bytes(p.bytes_freed)} "
              f"({format_bytes(p.bytes_remaining)} remain)")
        if p.delete:
            print("dry run: nothing was deleted; add --apply to delete")
        return exit_code
    extra = []
    if result.already_gone:
        extra.append(f"{result.already_gone} already gone")
    if result.changed:
        extra.append(f"{result.changed} changed since the listing (left alone)")
    if result.errors:
        extra.append(f"{len(result.errors)} failed")
    print(f"deleted {result.deleted} entries, freed {format_bytes(result.bytes_freed)}"
          + (f" ({', '.join(extra)})" if extra else ""))
    for message in result.errors[:10]:
        print(f"jaxcache: error: {message}", file=sys.stderr)
    if len(result.errors) > 10:
        print(f"jaxcache: ... and {len(result.errors) - 10} more errors", file=sys.stderr)
    return exit_code


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, exposed for tests and for the README's help text."""
    parser = argparse.ArgumentParser(
        prog="jaxcache",
        description="Inspect and manage JAX persistent compilation caches on local/NFS directories and GCS.",
        epilog="Exit codes: 0 ok, 1 problems found (doctor), 2 usage or input error.",
    )
    parser.add_argument("--version", action="version", version=f"jaxcache {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = sub.add_parser("ls", help="list the entries of a cache root",
                        description="List compiled programs in a cache root with size, stored compile "
                                    "seconds, age and compression.")
    ls.add_argument("root", metavar="ROOT", help=_ROOT_HELP)
    ls.add_argument("--json", action="store_true", help="print JSON (stable field names) instead of a table")
    ls.add_argument("--sort", choices=sorted(_SORTS), default="name",
                    help="order: size and compile largest first, age oldest first, name A-Z (default: name)")
    ls.add_argument("--function", metavar="GLOB", help="only functions (module names) matching GLOB, e.g. 'jit_train*'")
    ls.add_argument("--limit", metavar="N", type=_non_negative, help="show at most N entries")
    ls.set_defaults(run=cmd_ls)

    st = sub.add_parser("stats", help="totals for a cache root",
                        description="Entries, bytes, stored compile seconds, compression mix, corrupt entries "
                                    "(from a header check) and orphaned -atime files, with a per-function table.")
    st.add_argument("root", metavar="ROOT", help=_ROOT_HELP)
    st.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    st.add_argument("--top", metavar="N", type=_non_negative, default=20,
                    help="functions to show in the table (default 20; --json lists all)")
    st.set_defaults(run=cmd_stats)

    dr = sub.add_parser("doctor", help="validate every entry and explain what is wrong",
                        description="Decompress every entry, list corrupt ones with the reason, list orphaned "
                                    "-atime files, and explain mixed compression. Exits 1 if anything needs "
                                    "attention.")
    dr.add_argument("root", metavar="ROOT", help=_ROOT_HELP)
    dr.add_argument("--verify", action="store_true",
                    help="integrity: compare each entry with its writer's recorded digest and its embedded program "
                         "name; classes ok, tampered, corrupt, mismatched, pending (younger than --min-age), "
                         "unattested")
    dr.add_argument("--min-age", default="1h", metavar="DURATION",
                    help="with --verify: entries younger than this that look broken are pending (default 1h)")
    dr.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    dr.set_defaults(run=cmd_doctor)

    pr = sub.add_parser(
        "prune", help="delete entries by size, age, function, corruption (dry run unless --apply)",
        description="Delete entries that ANY selecting rule picks (--max-size, --unused-for, --older-than, "
                    "--function, --corrupt, --orphans, --stale-jaxlib) unless a keep rule protects them (--keep, "
                    "--min-age). Prints what would go and why; nothing is deleted without --apply. Deleting "
                    "entries while jobs run is safe: JAX recompiles what is missing. Rules about use read the "
                    "root's run records (.jaxcache/runs/) for reported hits and writers.",
        epilog="Sizes: 500MiB, 50GiB, 50GB. Durations: 45s, 30m, 12h, 14d, 2w. Exit codes: 0 ok, 1 some "
               "deletions failed, 2 usage or input error.",
    )
    pr.add_argument("root", metavar="ROOT", help=_ROOT_HELP)
    pr.add_argument("--max-size", metavar="SIZE",
                    help="evict least recently used entries until the root holds at most SIZE")
    pr.add_argument("--unused-for", metavar="DURATION", help="entries not used for DURATION (newest of -atime "
                    "files, hits reported by run records, and creation time)")
    pr.add_argument("--older-than", metavar="DURATION", help="entries created more than DURATION ago")
    pr.add_argument("--function", metavar="GLOB", action="append",
                    help="entries of functions (module names) matching GLOB, e.g. 'jit_old_*'; repeat for more")
    pr.add_argument("--corrupt", action="store_true",
                    help="entries whose head does not decode (the scan's header check; `jaxcache doctor` does the "
                         "full check)")
    pr.add_argument("--orphans", action="store_true", help="orphaned -atime files whose entry is gone")
    pr.add_argument("--stale-jaxlib", action="store_true",
                    help="entries whose first writer's jaxlib no run used within --stale-jaxlib-window (from run "
                         "records; an entry no record names is kept)")
    pr.add_argument("--stale-jaxlib-window", metavar="DURATION", help="for --stale-jaxlib (default 14d)")
    pr.add_argument("--integrity", metavar="CLASSES",
                    help="entries whose integrity check (as doctor --verify) finds them tampered, mismatched "
                         "and/or corrupt, comma-separated, e.g. tampered,mismatched,corrupt")
    pr.add_argument("--keep", metavar="PATTERN", action="append",
                    help="never delete entries whose key, or function name, matches PATTERN (a key or a glob); "
                         "repeat for more")
    pr.add_argument("--min-age", metavar="DURATION", default=None,
                    help="never delete anything created less than DURATION ago (default 1h; 0s turns it off)")
    pr.add_argument("--apply", action="store_true", help="delete (without it, only print the plan)")
    pr.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    pr.add_argument("-v", "--verbose", action="store_true", help="with --apply, a line per removed entry on stderr")
    pr.set_defaults(run=cmd_prune)
    # Listed for --help only: main() hands `jaxcache warmup ...` to the warm-up CLI before parsing.
    sub.add_parser("warmup", help="pre-fill a cache for a cluster topology (same as `warmup`; see warmup --help)",
                   add_help=False)
    sv = sub.add_parser(
        "serve", help="run the catalog service (REST API, metrics) over named cache roots",
        description="Serve the catalog of one or more cache roots over HTTP. Every flag can also be set with "
                    "the environment variable of the same name: JAXCACHE_CACHES (JSON object name->URL), "
                    "JAXCACHE_HOST, JAXCACHE_PORT, JAXCACHE_DB, JAXCACHE_RESCAN_S, JAXCACHE_TOKENS, "
                    "JAXCACHE_TOKENS_FILE, JAXCACHE_INSECURE_NO_AUTH. Flags win over the environment.",
    )
    sv.add_argument("--cache", metavar="NAME=URL", action="append", default=[],
                    help="a cache root to serve under NAME (repeatable), e.g. --cache prod=gs://bucket/jax-cache")
    sv.add_argument("--host", help="address to listen on (default 127.0.0.1; others need tokens)")
    sv.add_argument("--port", type=_non_negative, help="port (default 8080)")
    sv.add_argument("--db", metavar="URL",
                    help="catalog database as an SQLAlchemy URL (default: an SQLite file under ~/.local/state)")
    sv.add_argument("--rescan-s", type=float, metavar="SECONDS", help="seconds between background rescans (300)")
    sv.add_argument("--tokens-file", metavar="PATH", help="lines of '<sha256 hex of token> <read|report|admin>'")
    sv.add_argument("--insecure-no-auth", action="store_true", default=None,
                    help="serve every route without tokens on any address (labs only)")
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    """Build settings from the environment, let flags override, and run the service."""
    try:
        from jaxcache.service.server import serve
        from jaxcache.service.settings import ServiceSettings
    except ImportError as exc:
        raise MissingDependencyError(f"the service needs its extra: pip install 'jaxcache[service]' ({exc})") from None
    overrides: dict[str, Any] = {}
    if args.cache:
        caches = {}
        for item in args.cache:
            name, sep, url = item.partition("=")
            if not sep or not name or not url:
                raise InvalidInputError(f"--cache {item!r}: expected NAME=URL, e.g. demo=./demo-cache")
            caches[name] = url
        overrides["caches"] = caches
    for flag in ("host", "port", "db", "rescan_s", "tokens_file", "insecure_no_auth"):
        value = getattr(args, flag)
        if value is not None:
            overrides[flag] = value
    from pydantic import ValidationError

    try:
        settings = ServiceSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError(f"bad service settings: {problems}") from None
    serve(settings)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["warmup"]:
        # Warm-up has its own parser (and its own `--` for script arguments); this is only its second name.
        from jaxcache.warmup.cli import main as warmup_main

        return warmup_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return cmd_serve(args)
        storage = open_storage(args.root)
        return args.run(args, storage)
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
