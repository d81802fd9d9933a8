"""The report drain alone, in this process: a storm's records (bench/reports.py's job) put into the inbox of an SQLite
catalog (``--catalog postgresql``: a throwaway PostgreSQL server's) a pass at a time and folded, start records first,
then the final ones that replace them; milliseconds of wall and CPU (this process's) per record, and with
``--statements`` the SQL that took the time. No HTTP, no probes: the ceiling the drain sets on the storm.
``--busy-neighbor`` keeps another process spinning meanwhile (what any other work on a 2-core machine does to this
one). Figures, not assertions; what they mean: README.md.

    .venv/bin/python bench/drain.py --records 1000 --keys 200
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from catalogs import postgres  # noqa: E402
from reports import job_records  # noqa: E402


@contextlib.contextmanager
def busy_neighbor(on: bool) -> Iterator[None]:
    """Another process spinning on the CPU for as long as the block runs."""
    if not on:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def timed_statements(*engines) -> collections.Counter:
    """Seconds by ingestion function and statement on ``engines``, from now on."""
    from sqlalchemy import event

    spent: collections.Counter = collections.Counter()

    def before(conn, cursor, statement, params, context, executemany) -> None:
        conn.info["bench_t"] = time.perf_counter()

    def after(conn, cursor, statement, params, context, executemany) -> None:
        ours = [f for f in traceback.extract_stack() if "/service/reports/" in f.filename]
        where = f"{os.path.basename(ours[-1].filename)}:{ours[-1].name}" if ours else "?"
        spent[f"{where}  {' '.join(statement.split())[:60]}"] += time.perf_counter() - conn.info["bench_t"]

    for e in engines:
        event.listen(e, "before_cursor_execute", before)
        event.listen(e, "after_cursor_execute", after)
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000, help="processes of the job: one record each")
    parser.add_argument("--keys", type=int, default=200, help="keys per final record (start records: a fifth)")
    parser.add_argument("--pass-records", type=int, default=256, help="records put into the inbox between drains")
    parser.add_argument("--first-pass", type=int, default=0,
                        help="fold this many start records alone first (a storm's drain wakes at its first POST: the "
                             "new run's first pass is small)")
    parser.add_argument("--opened", type=int, default=0,
                        help="open this many of the pool's connections first, each reading the schema (as a "
                             "replica's first rescan and requests do), so that passes also run on them")
    parser.add_argument("--busy-neighbor", action="store_true", help="spin another process meanwhile")
    parser.add_argument("--statements", action="store_true",
                        help="the final records' time by SQL statement (on PostgreSQL, wall time: the server's CPU "
                             "too)")
    parser.add_argument("--catalog", choices=("sqlite", "postgresql"), default="sqlite")
    args = parser.parse_args(argv)
    if args.catalog == "postgresql":
        with postgres() as url:
            if url is None:
                return 1
            return run(args, url)
    return run(args, None)


def run(args: argparse.Namespace, url: str | None) -> int:
    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.reports.ingest import queue

    now = time.time()
    modules = ["jit_train_step", "jit_eval_step"]
    # As reports.py posts them: the same processes, started at the same time, their start records 580 s earlier.
    phases = {"start": job_records(modules, 20_000, args.records, args.keys, final=False, now=now - 580),
              "final": job_records(modules, 20_000, args.records, args.keys, final=True, now=now)}
    work = tempfile.mkdtemp(prefix="jaxcache-bench-drain-")
    catalog = Catalog(url or f"sqlite:///{work}/catalog.sqlite")
    try:
        opened = [catalog.engine.connect() for _ in range(args.opened)]
        for conn in opened:
            conn.exec_driver_sql("SELECT count(*) FROM process_keys").all()
            conn.close()
        print(f"{args.catalog}: {args.records} processes, {args.keys} keys a final record, passes of "
              f"{args.pass_records}{', another process spinning' if args.busy_neighbor else ''}; {os.cpu_count()} CPUs")
        spent: collections.Counter = collections.Counter()
        with busy_neighbor(args.busy_neighbor):
            for phase, records in phases.items():
                if phase == "final" and args.statements:
                    spent = timed_statements(catalog.engine, catalog.write_engine)
                wall = cpu = 0.0
                first = args.first_pass if phase == "start" and args.first_pass else args.pass_records
                for i, j in itertools.pairwise([0, *range(first, len(records), args.pass_records), len(records)]):
                    for record in records[i:j]:
                        queue.accept(catalog, "bench", record, record.to_json())
                    t, c = time.perf_counter(), time.thread_time()
                    queue.drain(catalog, "bench")
                    wall += time.perf_counter() - t
                    cpu += time.thread_time() - c
                n = len(records)
                print(f"  {phase:5} drain: {wall / n * 1e3:6.2f} ms wall, {cpu / n * 1e3:6.2f} ms CPU a record "
                      f"({n / wall:.0f} records/s)")
        for what, seconds in spent.most_common(12):
            print(f"    {seconds / len(phases['final']) * 1e3:6.2f} ms a record  {what}")
    finally:
        catalog.dispose()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
