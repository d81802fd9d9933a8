"""A report storm: a job of ``--records`` processes posting their run records to one service at once, as it does
within seconds of its start and of its end. Records/s from the first ``POST /v1/reports`` (at ``--clients``
connections) until the drain has folded the last one (the inbox empty: its figures show in the catalog), and
records/s accepted (the POSTs alone); meanwhile ``GET /healthz`` and listing pages, on an SQLite and a PostgreSQL
catalog; afterwards the catalog must hold every run (exit status 1 if it does not). Before each catalog's storm, a
baseline in the same run: how long a fixed loop takes on every CPU at once. Figures, not assertions (besides the
count); what each figure means: bench/README.md.

    .venv/bin/python bench/reports.py --records 1000 --keys 200
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu  # noqa: E402
from api import distinct_pages, pct  # noqa: E402
from catalogs import postgres, wait_folded  # noqa: E402
from entries import build_root, key_of, load_sources, make_source  # noqa: E402
from serving import service, settle  # noqa: E402

JOB = "storm"
RUN = "storm-run-1"
#: The share of a process's keys the cache already has (hits); the rest are new programs: process 0 compiles and
#: writes each, the others compile it too (misses: only process 0 writes the cache).
HIT_SHARE = 0.7


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def job_records(modules: list[str], entries: int, processes: int, keys: int, *, final: bool, now: float) -> list:
    """One run of a job of ``processes`` processes, one record each, as the client writes them: every process
    touches the same ``keys`` programs (SPMD), each key with its parts and signature. ``final`` False: the
    records a few seconds after the start (a fifth of the keys seen so far)."""
    from jaxcache import keyparts as kp
    from jaxcache import records
    from jaxcache.keyparts import KeyParts, ProgramSignature

    rng = random.Random(processes * 7919 + keys)
    started = now - (600 if final else 20)
    fp = records.Fingerprint(jax="0.12.0", jaxlib="0.12.0", backend="gpu", device_kind="NVIDIA H100 80GB HBM3",
                             device_count=processes * 8, local_device_count=8, process_count=processes,
                             compression="zstandard", python="3.11.9",
                             xla_flags=("--xla_gpu_enable_latency_hiding_scheduler=true",))
    hits = int(keys * HIT_SHARE)
    programs = []
    for i in range(keys):
        if i < hits:  # entries the root has (bench/entries.py keys), so listings show their hits
            n = (i * 7) % entries
            module, key = modules[n % len(modules)], key_of(modules[n % len(modules)], n)
        else:
            module = f"jit_step_v2_{i % 17}"
            key = f"{module}-{_h(f'new{i}')}"
        parts = KeyParts(**{p: _h(f"{p}:{module}:{i if p == kp.COMPUTATION else 0}") for p in kp.ORDER})
        program = ProgramSignature(args=(f"f32[{8 * (i % 16 + 1)},1024]", "f32[1024,1024]"),
                                   results=(f"f32[{8 * (i % 16 + 1)},1024]",))
        programs.append((key, i < hits, parts, program))
    seen = programs if final else programs[: keys // 5]
    out = []
    for p in range(processes):
        usages = []
        for j, (key, cached, parts, program) in enumerate(seen):
            at = started + 5 + j * 0.5
            if cached:
                usages.append(records.KeyUsage(key=key, event=records.HIT, hits=rng.randint(1, 3) if final else 1,
                                               retrieval_s=0.05, saved_s=4.0, size_bytes=100_000, first_at=at,
                                               last_at=at + 100, parts=parts, program=program))
            elif p == 0:
                usages.append(records.KeyUsage(key=key, event=records.WRITE, compiles=1, writes=1, compile_s=12.5,
                                               size_bytes=2_000_000, first_at=at, last_at=at, parts=parts,
                                               program=program))
            else:
                usages.append(records.KeyUsage(key=key, event=records.COMPILED, compiles=1, compile_s=12.5,
                                               reason="only process 0 writes the cache", first_at=at, last_at=at,
                                               parts=parts, program=program))
        out.append(records.RunRecord(job=JOB, run_id=RUN, process_index=p, process_count=processes,
                                     host=f"node-{p // 8:04d}", pid=1000 + p, started_at=started,
                                     updated_at=now, fingerprint=fp, topology=f"{processes}x8", final=final,
                                     keys=usages))
    return out


# ---- load --------------------------------------------------------------------------------------------------


async def _storm(base: str, bodies: list[bytes], clients: int) -> dict:
    """POST every body, ``clients`` at a time, each client on one keep-alive connection; every response's status
    and latency, and the wall time. Plain asyncio streams: httpx spends milliseconds of CPU a request, and on a
    2-core machine it, not the service, was what a storm of 200 KB bodies measured."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not queue.empty():
                body = queue.get_nowait()
                head = (f"POST /v1/reports?cache=bench HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
                        f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
                t = time.perf_counter()
                writer.write(head + body)
                await writer.drain()
                status_line = await reader.readline()
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - t)
                status = int(status_line.split()[1])
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return {"wall_s": time.perf_counter() - started, "latencies": latencies, "statuses": statuses}


def probe(base: str, paths_file: str, gap_s: str = "0.005") -> None:
    """In a process of its own until stdin closes: one client asks /healthz, another listing pages (each a page
    not asked within the page cache's lifetime), each request ``gap_s`` after the previous answer. Prints
    latencies. The standard library's HTTP client on a keep-alive connection: httpx cost this process half a core
    at the default gap, taken from the service it measures on a 2-core machine."""
    import http.client

    with open(paths_file) as f:
        paths = json.load(f)
    host, port = base.removeprefix("http://").rsplit(":", 1)
    stop = threading.Event()
    got: dict[str, list[float]] = {"healthz": [], "listing": []}
    errors: list[str] = []

    def loop(name: str, next_path) -> None:
        c, i = http.client.HTTPConnection(host, int(port), timeout=120), 0
        while not stop.is_set():
            path, t = next_path(i), time.perf_counter()
            i += 1
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            got[name].append(time.perf_counter() - t)
            if r.status != 200:
                errors.append(f"{path}: {r.status}")
            time.sleep(float(gap_s))  # a client polling, not a load generator
        c.close()

    threads = [threading.Thread(target=loop, args=("healthz", lambda i: "/healthz")),
               threading.Thread(target=loop, args=("listing", lambda i: paths[i % len(paths)]))]
    for t in threads:
        t.start()
    sys.stdout.write("started\n")
    sys.stdout.flush()
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({**got, "errors": errors[:20]}))


@contextlib.contextmanager
def probing(base: str, paths_file: str, gap_s: float) -> Iterator[dict]:
    """The probe process running while the block runs; its latencies in the yielded dict afterwards."""
    proc = subprocess.Popen([sys.executable, __file__, "--probe", base, paths_file, str(gap_s)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "started"
    out: dict = {}
    try:
        yield out
    finally:
        rest, _ = proc.communicate("", timeout=300)
        out.update(json.loads(rest))


def _summary(latencies: list[float]) -> dict:
    if not latencies:
        return {"n": 0}
    return {"n": len(latencies), "p50_ms": round(pct(latencies, 50) * 1000, 2),
            "p99_ms": round(pct(latencies, 99) * 1000, 2), "max_ms": round(max(latencies) * 1000, 2)}


# ---- one service -------------------------------------------------------------------------------------------


def count_runs(db: str) -> dict:
    """Straight from the catalog: the storm's processes, final ones, the keys their figures hold, and the run's usage
    rows (one per key)."""
    from sqlalchemy import func, select

    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import RunRow, UsageRow

    catalog = Catalog(db, migrate=False)
    try:
        with catalog.reader() as conn:
            runs = conn.execute(select(func.count()).where(RunRow.cache == "bench", RunRow.run_id == RUN)).scalar()
            final = conn.execute(select(func.count()).where(RunRow.cache == "bench", RunRow.run_id == RUN,
                                                            RunRow.final.is_(True))).scalar()
            usage = conn.execute(select(func.count()).where(UsageRow.cache == "bench", UsageRow.run_id == RUN)).scalar()
            keys = conn.execute(select(func.sum(RunRow.keys)).where(RunRow.cache == "bench", RunRow.run_id == RUN)
                                ).scalar()
            processes = conn.execute(select(func.sum(UsageRow.processes)).where(
                UsageRow.cache == "bench", UsageRow.run_id == RUN)).scalar()
    finally:
        catalog.dispose()
    return {"runs": runs, "final": final, "process_keys": keys, "usage_rows": usage, "usage_processes": processes}


#: The baseline's work: a fixed loop of the interpreter, about a second on this project's 2-core machines.
BASELINE_LOOP = "x = 0\nfor i in range(10_000_000):\n    x += i * i"


def machine_baseline() -> float:
    """Wall seconds one process a CPU take to run BASELINE_LOOP all at once: how fast this machine runs with every
    core busy, measured in the same run as the storm. Its speed under load varies from day to day (the same code's
    CPU a record did by half), where one core timed alone barely moves; this says which a storm's figure met."""
    started = time.perf_counter()
    loops = [subprocess.Popen([sys.executable, "-c", BASELINE_LOOP]) for _ in range(os.cpu_count() or 1)]
    for loop in loops:
        loop.wait()
    return time.perf_counter() - started


def storm_on(name: str, db: str, root: str, work: str, args, modules: list[str]) -> dict:
    fig: dict = {"catalog": name, "baseline_s": round(machine_baseline(), 2)}
    with service(root, db, work, args.workers, args.split, args.service_cpus) as (base, serving_pid, loops):
        if args.settle_s:
            waited = settle(loops, args.settle_s)
            fig["settled_s"] = None if waited is None else round(waited, 1)
        paths = distinct_pages(base, 200)
        paths_file = os.path.join(work, "paths.json")
        with open(paths_file, "w") as f:
            json.dump(paths, f)
        with probing(base, paths_file, args.probe_gap_s) as quiet:  # the same probes without a storm: the baseline
            before = cpu.snapshot()
            time.sleep(args.quiet_s)
            spent = cpu.by_role(before, cpu.snapshot(), serving_pid)
        fig["quiet"] = {"healthz": _summary(quiet["healthz"]), "listing": _summary(quiet["listing"]),
                        "cpu_s_per_s": {role: round(s / args.quiet_s, 3) for role, s in spent.items()}}
        now = time.time()
        for phase, final in (("start", False), ("end", True)):
            bodies = [r.to_json() for r in job_records(modules, args.entries, args.records, args.keys, final=final,
                                                       now=now if final else now - 580)]
            with probing(base, paths_file, args.probe_gap_s) as during:
                before = cpu.snapshot()
                if args.hold_drain:  # stopped between passes: the inbox is empty before a storm
                    os.kill(serving_pid[1], signal.SIGSTOP)
                started = time.perf_counter()
                try:
                    storm = asyncio.run(_storm(base, bodies, args.clients))
                finally:
                    if args.hold_drain:
                        os.kill(serving_pid[1], signal.SIGCONT)
                folded_s = wait_folded(base) - started
                after = cpu.snapshot()
                spent = cpu.by_role(before, after, serving_pid)
                if args.split:  # the service's share that was the loops process's (the drain's)
                    spent["of_which_loops"] = cpu.by_role(before, after, serving_pid[1])["service"]
            fig[phase] = {
                "records": len(bodies), "keys_per_record": len(json.loads(bodies[0])["keys"]),
                "body_kib_median": round(statistics.median(len(b) for b in bodies) / 1024, 1),
                "wall_s": round(folded_s, 2), "records_per_s": round(len(bodies) / folded_s, 1),
                "accepted_s": round(storm["wall_s"], 2),
                "accepted_per_s": round(len(bodies) / storm["wall_s"], 1),
                "statuses": storm["statuses"], "post": _summary(storm["latencies"]),
                "healthz": _summary(during["healthz"]), "listing": _summary(during["listing"]),
                "probe_errors": during["errors"], "cpu_s": spent,
            }
    fig["catalog_after"] = count_runs(db)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000, help="processes of the job: one record each")
    parser.add_argument("--keys", type=int, default=200, help="keys per final record")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--entries", type=int, default=20_000, help="entries in the root (listings page them)")
    parser.add_argument("--workers", type=int, help="jaxcache serve --workers (default: the service's default)")
    parser.add_argument("--split", action="store_true",
                        help="serve as `--role api --workers N` beside one `--role loops` process (the drain and "
                             "rescans in a process that answers no storm), instead of one `jaxcache serve`")
    parser.add_argument("--hold-drain", action="store_true",
                        help="with --split: stop the --role loops process (SIGSTOP) while the POSTs are answered and "
                             "let it fold them after (SIGCONT): accepting without the drain's write transactions "
                             "beside it, the storm's records folded after")
    parser.add_argument("--service-cpus", metavar="LIST",
                        help="run the service on these CPUs only (taskset -c, e.g. 0,1) and the rest elsewhere: on a "
                             "machine with more cores, the service's figures on that many without the clients' and "
                             "probes' share (start this script itself under taskset on the other CPUs)")
    parser.add_argument("--catalogs", default="sqlite,postgresql")
    parser.add_argument("--quiet-s", type=float, default=3.0, help="seconds of probes before the storms")
    parser.add_argument("--settle-s", type=float, default=600.0,
                        help="wait at most this long for the service's first rescan and integrity pass to end before "
                             "the storms (0: storm at once, as bench/README.md's figures before 2026-12 did)")
    parser.add_argument("--source", help="a real JAX cache dir to copy entries from (default: jaxcache.warmup.demo)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--probe-gap-s", type=float, default=0.005,
                        help="seconds each probe client waits after an answer before its next request (the default "
                             "keeps about 20 distinct listing pages a second coming during the storm, which costs "
                             "the service CPU of its own; 0.5 measures the storm with little besides)")
    parser.add_argument("--probe", nargs=3, metavar=("BASE", "PATHS", "GAP_S"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hold_drain and not args.split:
        parser.error("--hold-drain needs --split (the drain in a process of its own)")
    if args.probe:
        probe(*args.probe)
        return 0

    work = tempfile.mkdtemp(prefix="jaxcache-bench-reports-")
    figures = []
    try:
        sources = load_sources(args.source or make_source(work))
        modules = [m for m, _ in sources]
        for name in args.catalogs.split(","):
            root = os.path.join(work, f"cache-{name}")
            build_root(sources, root, args.entries)
            if name == "sqlite":
                figures.append(storm_on(name, f"sqlite:///{work}/catalog.sqlite", root, work, args, modules))
            elif name == "postgresql":
                with postgres() as url:
                    if url is not None:
                        figures.append(storm_on(name, url, root, work, args, modules))
            else:
                sys.exit(f"error: --catalogs: unknown catalog {name!r} (sqlite, postgresql)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    print(f"a job of {args.records} processes, {args.keys} keys each, {args.clients} clients posting; "
          f"{args.entries} entries; workers {args.workers or 'default'}"
          f"{' (--role api) beside one --role loops process' if args.split else ''}"
          f"{', the loops process stopped while the POSTs are answered' if args.hold_drain else ''}"
          f"{f'; the service on CPUs {args.service_cpus}' if args.service_cpus else ''}; {os.cpu_count()} CPUs")
    for fig in figures:
        print(f"{fig['catalog']}: quiet healthz p99 {fig['quiet']['healthz'].get('p99_ms')} ms, listing p99 "
              f"{fig['quiet']['listing'].get('p99_ms')} ms; background loops settled after "
              f"{fig.get('settled_s', 'no wait')} s; machine baseline {fig['baseline_s']} s (a fixed loop on "
              "every CPU at once, before the service started: lower is faster)")
        print("        CPU s a second, probes alone: " + ", ".join(
            f"{role} {seconds:.2f}" for role, seconds in fig["quiet"]["cpu_s_per_s"].items()))
        for phase in ("start", "end"):
            f = fig[phase]
            print(f"  {phase:5} {f['records']} records x {f['keys_per_record']} keys ({f['body_kib_median']} KiB): "
                  f"{f['records_per_s']:7.1f} records/s folded (target >= 200), {f['wall_s']} s "
                  f"({f['accepted_per_s']:.1f}/s accepted, {f['accepted_s']} s), statuses {f['statuses']}; "
                  f"POST p50 {f['post'].get('p50_ms')} p99 {f['post'].get('p99_ms')} ms; healthz p99 "
                  f"{f['healthz'].get('p99_ms')} ms (<= 50); listing p99 {f['listing'].get('p99_ms')} ms (<= 250)")
            print("        CPU ms a record: " + ", ".join(
                f"{role} {seconds * 1000 / f['records']:.2f}" for role, seconds in f["cpu_s"].items()))
        after = fig["catalog_after"]
        print(f"  catalog after: {after['runs']} runs ({after['final']} final) holding {after['process_keys']} keys, "
              f"{after['usage_rows']} usage rows counting {after['usage_processes']} processes' keys; expected "
              f"{args.records} runs, {args.records} final, {args.records * args.keys} keys, {args.keys} rows")
    expected = {"runs": args.records, "final": args.records, "process_keys": args.records * args.keys,
                "usage_rows": args.keys, "usage_processes": args.records * args.keys}
    lost = [f"{fig['catalog']}: {name} {fig['catalog_after'][name]} (expected {value})" for fig in figures
            for name, value in expected.items() if fig["catalog_after"][name] != value]
    if lost:
        print("records lost or miscounted: " + "; ".join(lost), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
