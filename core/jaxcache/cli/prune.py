"""``jaxcache prune``: the service's prune policy applied straight to a root (dry run unless ``--apply``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

from jaxcache import collector
from jaxcache.cli.indexed import INDEX_HELP, IndexedRoot
from jaxcache.cli.ls_table import skipped_note
from jaxcache.cli.output import EXIT_OK, EXIT_PROBLEMS, ROOT_HELP, flag_value, print_json, progress
from jaxcache.display import shown
from jaxcache.errors import InvalidInputError
from jaxcache.prune import (
    CORRUPT_REASON,
    Candidate,
    CandidateColumns,
    Decision,
    PrunePlan,
    PrunePolicy,
    PruneResult,
    apply,
    plan,
)
from jaxcache.prune.candidates import CandidateList
from jaxcache.prune.listed import listed_candidates
from jaxcache.prune.policy import PROOF_CLASSES
from jaxcache.scan import Entry
from jaxcache.storage import Storage
from jaxcache.table import render
from jaxcache.units import format_bytes, format_duration, parse_bytes, parse_duration, plural
from jaxcache.usage import RecordedUse, read_usage

_PRUNE_TABLE_ROWS = 50
#: The flags that select entries, named alike by the "no rule" error and --help.
SELECTING = ("--max-size", "--unused-for", "--older-than", "--function", "--corrupt", "--orphans", "--stale-jaxlib",
             "--integrity")
_NO_RULE = (f"nothing selects entries: give {', '.join(SELECTING[:-1])} or {SELECTING[-1]} (--keep and --min-age "
            "only protect entries)")


def _prune_policy(args: argparse.Namespace) -> PrunePolicy:
    min_age = flag_value("--min-age", parse_duration, args.min_age)
    window = flag_value("--stale-jaxlib-window", parse_duration, args.stale_jaxlib_window)
    if window is not None and not args.stale_jaxlib:
        raise InvalidInputError("--stale-jaxlib-window needs --stale-jaxlib")
    if args.no_index and not args.corrupt:  # only --corrupt reads heads, so only it uses the head index
        raise InvalidInputError("--no-index needs --corrupt: without it prune reads no entry heads and no index")
    extra = {} if window is None else {"stale_jaxlib_window_s": window}
    return PrunePolicy(
        max_total_bytes=flag_value("--max-size", parse_bytes, args.max_size),
        unused_for_s=flag_value("--unused-for", parse_duration, args.unused_for),
        older_than_s=flag_value("--older-than", parse_duration, args.older_than),
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


def _apply_withprogress(storage: Storage, p: PrunePlan, verbose: bool) -> PruneResult:
    if verbose:
        def say(d: Decision) -> None:
            print(f"removed {shown(d.candidate.name)}", file=sys.stderr, flush=True)

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


def _candidates(storage: Storage, policy: PrunePolicy, use: RecordedUse | None, details: dict[str, str], *,
                use_index: bool) -> CandidateColumns:
    """What the plan is made over. ``details`` gets what is wrong with each corrupt entry."""
    if not policy.corrupt:
        # Every other rule reads only what the listing says: the plan reads its columns, and makes objects only for
        # the decisions printed (a dry run of 100k entries prints 50).
        return listed_candidates(storage, hits=use.last_hit_s if use is not None else None,
                                 writers=use.writer_jaxlib if use is not None else None)
    # Heads (one small read per entry) are needed only to find corrupt entries: the head index has those it read
    # before (an entry changed since is read again, as for `ls`).
    root = IndexedRoot(storage, use_index=use_index)
    records: list[Candidate] = []
    for record in progress(root.records(read_headers=True), "scanning"):
        if isinstance(record, Entry) and record.reason:
            details[record.key] = record.reason
        c = Candidate.from_record(record)
        records.append(use.apply_to(c) if use is not None else c)
    return CandidateList(records)


def _plan_json(args: argparse.Namespace, storage: Storage, policy: PrunePolicy, p: PrunePlan, now: float,
               details: dict[str, str], use: RecordedUse | None, result: PruneResult | None) -> dict[str, Any]:
    return {
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
        "skipped": storage.skipped.count,
        "result": None if result is None else {
            "deleted": result.deleted,
            "bytes_freed": result.bytes_freed,
            "already_gone": result.already_gone,
            "changed": result.changed,
            "errors": result.errors,
        },
    }


def _signature_orphans(storage: Storage, *, apply: bool) -> list[str]:
    """``<key>-sig`` objects whose entry is gone (JAX's LRU deletes only -cache and -atime), deleted if ``apply``."""
    from jaxcache import signing

    found = list(signing.orphans(storage))
    if apply:
        for name in found:
            storage.delete(name)
    return found


def cmd_prune(args: argparse.Namespace, storage: Storage) -> int:
    policy = _prune_policy(args)
    if not policy.selects_anything():
        raise InvalidInputError(_NO_RULE)
    details: dict[str, str] = {}
    # Run records matter only to rules about use: hits make LRU real where there are no -atime files (object stores).
    use = None
    if policy.stale_jaxlib or policy.max_total_bytes is not None or policy.unused_for_s is not None:
        use = read_usage(storage)
        for name, why in use.malformed[:10]:
            print(f"jaxcache: warning: skipping malformed run record {shown(name)}: {shown(why)}", file=sys.stderr)
    with collector.paused():  # the listing and its candidates: 100k entries make many objects and no cycles
        candidates = _candidates(storage, policy, use, details, use_index=not args.no_index)
    now = time.time()
    if policy.integrity:
        # Read every entry once and judge it against its writer's digest and embedded name.
        from jaxcache import integrity

        rows = list(candidates)
        attested = integrity.load_attestations(storage)
        scanned = [Entry(key=c.key, module=c.module, hash=c.key[-64:], name=c.name, size_bytes=c.size_bytes,
                         mtime_s=c.created_s, version=c.version) for c in rows if not c.orphan]
        verdicts = {v.key: v for v in progress(integrity.verify(storage, scanned, attested, now=now,
                                                                 min_age_s=policy.min_age_s), "verifying")}
        candidates = CandidateList([dataclasses.replace(c, integrity=verdicts[c.key].classification)
                                    if c.key in verdicts else c for c in rows])
        for key, v in verdicts.items():
            if v.classification in integrity.BAD_CLASSES:
                details[key] = "; ".join(v.reasons)
    recent = use.recent_jaxlibs(now - policy.stale_jaxlib_window_s) if use is not None else None
    with collector.paused():
        p = plan(candidates, policy, now=now, recent_jaxlibs=recent)
        if not args.json:
            _print_prune_plan(p, details, now)
    if not args.json:
        if p.delete or p.protected:
            print()
        for note in p.notes:
            print(f"note: {note}")
        if storage.skipped.count:
            print(f"note: {skipped_note(storage.skipped.count)}; they are never deleted")
    result = _apply_withprogress(storage, p, args.verbose) if args.apply and p.delete else None
    if args.apply and result is None:
        result = PruneResult()
    sig_orphans = _signature_orphans(storage, apply=bool(args.apply)) if policy.orphans else []
    if sig_orphans and not args.json:
        print(f"{'deleted' if args.apply else 'would delete'} {plural(len(sig_orphans), 'signature object')} whose"
              " entry is gone (<key>-sig)")
    exit_code = EXIT_PROBLEMS if result is not None and result.errors else EXIT_OK
    if args.json:
        with collector.paused():  # a decision and a dict for each of 100k deletions
            print_json(_plan_json(args, storage, policy, p, now, details, use, result)
                       | {"signature_orphans": sig_orphans})
        return exit_code
    if result is None:
        print(f"would delete {plural(len(p.delete), 'entry')}, freeing {format_bytes(p.bytes_freed)} "
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
    print(f"deleted {plural(result.deleted, 'entry')}, freed {format_bytes(result.bytes_freed)}"
          + (f" ({', '.join(extra)})" if extra else ""))
    for message in result.errors[:10]:
        print(f"jaxcache: error: {shown(message)}", file=sys.stderr)
    if len(result.errors) > 10:
        print(f"jaxcache: ... and {len(result.errors) - 10} more errors", file=sys.stderr)
    return exit_code


def add_parser(sub: Any) -> None:
    """``prune``."""
    pr = sub.add_parser(
        "prune", help="delete entries by size, age, function, corruption (dry run unless --apply)",
        description=f"Delete entries that ANY selecting rule picks ({', '.join(SELECTING)}) unless a keep rule "
                    "protects them (--keep, --min-age). Prints what would go and why; nothing is deleted without "
                    "--apply. Deleting entries while jobs run is safe: JAX recompiles what is missing. Rules about "
                    "use read the root's run records (.jaxcache/runs/) for reported hits and writers.",
        epilog="Sizes: 500MiB, 50GiB, 50GB. Durations take a unit: 45s, 30m, 12h, 14d, 2w (14 alone is refused). "
               "Exit codes: 0 ok, 1 some deletions failed, 2 usage or input error.",
    )
    pr.add_argument("root", metavar="ROOT", help=ROOT_HELP)
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
    pr.add_argument("--orphans", action="store_true", help="orphaned -atime and -sig files whose entry is gone")
    pr.add_argument("--stale-jaxlib", action="store_true",
                    help="entries whose first writer's jaxlib no run used within --stale-jaxlib-window (from run "
                         "records; an entry no record names is kept)")
    pr.add_argument("--stale-jaxlib-window", metavar="DURATION", help="for --stale-jaxlib (default 14d)")
    pr.add_argument("--integrity", metavar="CLASSES", nargs="?", const=",".join(PROOF_CLASSES),
                    help="entries whose integrity check (as doctor --verify) finds them tampered, mismatched, "
                         "differs and/or corrupt, comma-separated; alone: the proven ones, "
                         f"{','.join(PROOF_CLASSES)} (differs proves nothing: name it to act on it)")
    pr.add_argument("--keep", metavar="PATTERN", action="append",
                    help="never delete entries whose key, or function name, matches PATTERN (a key or a glob); "
                         "repeat for more")
    pr.add_argument("--min-age", metavar="DURATION", default=None,
                    help="never delete anything created less than DURATION ago (default 1h; 0s turns it off)")
    pr.add_argument("--no-index", action="store_true", help=f"with --corrupt: {INDEX_HELP}")
    pr.add_argument("--apply", action="store_true", help="delete (without it, only print the plan)")
    pr.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    pr.add_argument("-v", "--verbose", action="store_true", help="with --apply, a line per removed entry on stderr")
    pr.set_defaults(run=cmd_prune)
