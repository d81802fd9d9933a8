"""``jaxcache explain ROOT``: why jobs compiled programs instead of loading them, from the root's own records."""

from __future__ import annotations

import argparse
import time
from typing import Any

from jaxcache.cli.output import EXIT_OK, ROOT_HELP, flag_value, not_recorded, print_json
from jaxcache.errors import InvalidInputError
from jaxcache.explain import Explanation, Known, explain
from jaxcache.explain.from_root import RootHistory, is_miss, read_root
from jaxcache.explain.text import blocks
from jaxcache.records import check_job, check_run_id
from jaxcache.storage import Storage
from jaxcache.units import parse_duration, plural


def explained(storage: Storage, *, job: str | None = None, run: str | None = None,
              since_s: float | None = None, now: float | None = None) -> tuple[list[dict[str, Any]], int]:
    """One dict per miss (the fields ``--json`` prints), and how many records were skipped as malformed.

    A ``job`` or ``run`` that no record of the root names is an error (a typo must not read as "no misses")."""
    now = time.time() if now is None else now
    found = read_root(storage)
    knowns, skipped = found.knowns, found.skipped
    if job is not None and job not in found.jobs:
        raise InvalidInputError(not_recorded("--job", job, found.jobs, "job", storage.url))
    if run is not None and run not in found.runs:
        raise InvalidInputError(not_recorded("--run", run, found.runs, "run", storage.url))
    history = RootHistory(storage, knowns, storage.iter_objects())
    out = []
    for miss in (k for k in knowns if is_miss(k)):
        if (job and miss.job != job) or (run and miss.run_id != run) or (since_s and miss.at < now - since_s):
            continue
        why = explain(miss, history, root=storage.url)
        out.append(_row(miss, why))
    out.sort(key=lambda r: (-(r["compile_s"] or 0.0), r["function"], r["key"]))
    return out, skipped


def _row(miss: Known, why: Explanation) -> dict[str, Any]:
    return {"function": miss.function, "key": miss.key, "job": miss.job, "run_id": miss.run_id,
            "process_index": miss.process_index, "compile_s": miss.compile_s, **why.as_dict()}


def cmd_explain(args: argparse.Namespace, storage: Storage) -> int:
    job = flag_value("--job", check_job, args.job)
    run = flag_value("--run", check_run_id, args.run_id)
    since = flag_value("--since", parse_duration, args.since)
    rows, skipped = explained(storage, job=job, run=run, since_s=since)
    if args.json:
        print_json({"root": storage.url, "misses": rows, "skipped_records": skipped})
        return EXIT_OK
    if not rows:
        print(f"no misses recorded in {storage.url}" + (" for that selection" if job or run or since else ""))
        return EXIT_OK
    print(blocks(rows))
    total = sum(r["compile_s"] or 0 for r in rows)
    print(f"\n{plural(len(rows), 'miss')}, {total:.1f} compile seconds" + (
        f"; {skipped} malformed records skipped" if skipped else ""))
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """``explain``."""
    ex = sub.add_parser(
        "explain", help="why jobs compiled programs instead of loading them",
        description="For every program a job compiled because the cache did not give it (a miss), name the cause "
                    "and the fix, from the root's run and warm-up records: skipped, evicted, unreadable, not_written, "
                    "new_program, unstable_program, program_changed, or the part of the key that differs from "
                    "the nearest entry of the same function (jaxlib, backend, xla_flags, compile_options, "
                    "devices, compression, custom_hook); unknown when nothing recorded tells.")
    ex.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    ex.add_argument("--job", metavar="NAME", help="only this job's misses (a job no record names: exit 2, naming the"
                                                          " recorded jobs closest to it)")
    ex.add_argument("--run", dest="run_id", metavar="RUN_ID",
                    help="only this run's misses (the id the client's summary prints; one no record names:"
                         " exit 2)")
    ex.add_argument("--since", metavar="DURATION", help="only misses of the last DURATION, with its unit (7d, 12h)")
    ex.add_argument("--json", action="store_true",
                    help="one object per miss: function, key, cause, differs, nearest, fix, compile_s, job, run_id")
    ex.set_defaults(run=cmd_explain)
