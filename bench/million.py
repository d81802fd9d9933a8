"""The service over a root of a million entries (local): catalog size, service memory, the periodic rescan against
a ``scandir`` + ``stat`` pass, distinct listing pages at 32 clients, stats latency and a prune plan. Figures, not
assertions; the one check is that the catalog holds every entry.

    .venv/bin/python bench/million.py --entries 1000000

Entries are hard links to a few real-format entries (a million 15 kB copies would be 15 GB and prove nothing
more: the service reads heads once and then only lists), each with its own ``-atime``; building 1M takes a few
minutes, the service's first rescan (which parses every head) a few more.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api import distinct_pages, pct, wrk, wrk_cycle  # noqa: E402
from entries import key_of, load_sources, make_source  # noqa: E402
from serving import free_port  # noqa: E402


def build(sources: list[tuple[str, bytes]], root: str, entries: int) -> None:
    os.makedirs(root)
    originals = []
    for i, (module, data) in enumerate(sources):
        path = os.path.join(root, key_of(module, i) + "-cache")
        with open(path, "wb") as f:
            f.write(data)
        originals.append(path)
    now = time.time_ns()
    for i in range(len(sources), entries):
        module, _ = sources[i % len(sources)]
        key = key_of(module, i)
        os.link(originals[i % len(sources)], os.path.join(root, key + "-cache"))
        with open(os.path.join(root, key + "-atime"), "wb") as f:
            f.write(struct.pack("<Q", now - i * 1_000_000_000))
        if (i + 1) % max(entries // 10, 1) == 0:
            print(f"built {i + 1}/{entries}", file=sys.stderr)


def scandir_stat(root: str) -> float:
    t = time.perf_counter()
    with os.scandir(root) as it:
        for de in it:
            de.stat()
    return time.perf_counter() - t


def _children(pid: int) -> list[int]:
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return kids


def _status(pid: int, pss: bool = True) -> dict[str, float]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM"):
                    out[name] = round(int(value.split()[0]) / 1024, 1)
        if not pss:
            return out
        with open(f"/proc/{pid}/smaps_rollup") as f:  # shared pages (libraries) counted a share per process
            for line in f:
                name, _, value = line.partition(":")
                if name == "Pss":
                    out["Pss"] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    return out


def _scanned(c) -> bool:
    """Whether a scan of the root has ended (its end is recorded after its last rows)."""
    caches = c.get("/v1/caches").json()["caches"]
    return any(x["name"] == "bench" and x["last_scan_s"] is not None for x in caches)


def memory(pid: int, pss: bool = True) -> dict:
    """Resident memory of the service, MiB: the serving process and its workers together (``VmRSS``; each one's
    in ``each_VmRSS``, the serving process first), the largest of them, the sum of each one's peak (``VmHWM``; an
    upper bound of the service's peak; each one's in ``each_VmHWM``), and ``Pss``: the same pages with each shared
    one (libraries) counted once across the processes, what the machine spends on the service."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += _children(p)
    each = [s for s in (_status(p, pss) for p in pids) if s]
    return {"VmRSS": round(sum(s.get("VmRSS", 0) for s in each), 1),
            "largest_VmRSS": max((s.get("VmRSS", 0) for s in each), default=0),
            "VmHWM": round(sum(s.get("VmHWM", 0) for s in each), 1), "processes": len(each),
            "Pss": round(sum(s.get("Pss", 0) for s in each), 1), "each_VmRSS": [s.get("VmRSS", 0) for s in each],
            "each_VmHWM": [s.get("VmHWM", 0) for s in each]}


def settled(pid: int, *, after_s: float = 6.0) -> dict[str, float]:
    """:func:`memory` ``after_s`` seconds after a request was answered: the service gives back what a large plan
    held once it has answered (a full collection, then ``malloc_trim``), in the background."""
    time.sleep(after_s)
    return memory(pid)


@contextlib.contextmanager
def peak_rss(pid: int, every_s: float = 0.05) -> Iterator[dict]:
    """The largest ``VmRSS`` of the service (every process together, MiB) sampled while the block runs, in the
    yielded dict as ``peak_VmRSS`` once it ends: what one request's work costs at its height, which neither the
    sum of the processes' lifetime peaks (``VmHWM``) nor a reading afterwards shows."""
    out: dict = {}
    stop = threading.Event()
    peak = [memory(pid, pss=False)["VmRSS"]]

    def sample() -> None:
        while not stop.wait(every_s):
            peak[0] = max(peak[0], memory(pid, pss=False)["VmRSS"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield out
    finally:
        stop.set()
        sampler.join()
        out["peak_VmRSS"] = peak[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=8, help="wrk duration of the distinct-pages phase")
    parser.add_argument("--repeat", type=int, default=3, help="periodic rescans measured")
    parser.add_argument("--source", help="a real JAX cache dir to copy entries from (default: jaxcache.warmup.demo)")
    parser.add_argument("--workers", type=int, help="`jaxcache serve --workers` (default: the service's default)")
    parser.add_argument("--work", help="a folder to build the root in and keep it for the next run (default: a "
                                       "temporary one, removed); the catalog is made anew each run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import httpx

    work = args.work or tempfile.mkdtemp(prefix="jaxcache-bench-million-")
    server = None
    fig: dict = {"entries": args.entries}
    try:
        root = os.path.join(work, f"cache-{args.entries}")
        t = time.perf_counter()
        if not os.path.exists(os.path.join(work, f"built-{args.entries}")):
            shutil.rmtree(root, ignore_errors=True)
            build(load_sources(args.source or make_source(work)), root, args.entries)
            open(os.path.join(work, f"built-{args.entries}"), "w").close()
        fig["build_s"] = round(time.perf_counter() - t, 1)
        # The catalog and what lies beside it: the loops' statuses there outlive the file, and a last run's would
        # say the integrity pass is done.
        for stale in (os.path.join(work, "kept"), *glob.glob(os.path.join(glob.escape(work), "catalog.sqlite*"))):
            shutil.rmtree(stale, ignore_errors=True)
            if os.path.isfile(stale):
                os.unlink(stale)
        port, db = free_port(), os.path.join(work, "catalog.sqlite")
        base = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}
        env["JAXCACHE_SNAPSHOT_DIR"] = os.path.join(work, "kept")
        exe = os.path.join(os.path.dirname(sys.executable), "jaxcache")
        started = time.perf_counter()
        server = subprocess.Popen(
            [exe, "serve", "--cache", f"bench={root}", "--port", str(port), "--rescan-s", "86400",
             "--db", f"sqlite:///{db}", "--insecure-no-auth",
             *(["--workers", str(args.workers)] if args.workers else [])],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with httpx.Client(base_url=base, timeout=600) as c:
            while True:
                try:
                    found = c.get("/v1/caches/bench/stats")
                    # Every row, and the scan over: rows are committed in parts, before the scan releases its memory.
                    if found.status_code == 200 and found.json()["entries"] >= args.entries and _scanned(c):
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None:
                    sys.exit("error: the service exited before it cataloged the root")
                time.sleep(2)
            fig["first_scan_s"] = round(time.perf_counter() - started, 1)
            fig["after_first_scan_mib"] = memory(server.pid)
            catalog_bytes = sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))
            fig["catalog_mib"] = round(catalog_bytes / 2**20, 1)

            rescans, bases = [], []
            for _ in range(args.repeat + 1):
                bases.append(scandir_stat(root))
                t = time.perf_counter()
                r = c.post("/v1/caches/bench/rescan")
                assert r.status_code == 200, r.text
                rescans.append(time.perf_counter() - t)
            # The first POSTed rescan may still find the snapshot missing (the background round's own is kept).
            fig["periodic_rescan_s"] = round(statistics.median(rescans[1:]), 3)
            fig["scandir_stat_s"] = round(statistics.median(bases[1:]), 3)
            fig["periodic_ratio"] = round(fig["periodic_rescan_s"] / fig["scandir_stat_s"], 2)
            fig["after_rescans_mib"] = memory(server.pid)

            stats = []
            for _ in range(10):
                t = time.perf_counter()
                assert c.get("/v1/caches/bench/stats").status_code == 200
                stats.append(time.perf_counter() - t)
            fig["stats_median_ms"] = round(statistics.median(stats) * 1000, 1)
            fig["stats_p99_ms"] = round(pct(stats, 99) * 1000, 1)

            half = c.get("/v1/caches/bench/stats").json()["size_bytes"] // 2
            t = time.perf_counter()
            with peak_rss(server.pid) as peak:
                plan = c.post("/v1/caches/bench/prune", json={"max_total_bytes": half, "min_age": "0s",
                                                              "dry_run": True})
            fig["prune_plan_s"] = round(time.perf_counter() - t, 2)
            fig["during_prune_plan_mib"] = peak["peak_VmRSS"]
            assert plan.status_code == 200, plan.text
            fig["prune_planned"] = plan.json()["delete_count"]
            fig["after_prune_plan_mib"] = settled(server.pid)
            # The same plan answered with every planned deletion listed, as before list_limit.
            t = time.perf_counter()
            with peak_rss(server.pid) as peak:
                whole = c.post("/v1/caches/bench/prune", json={"max_total_bytes": half, "min_age": "0s",
                                                               "list_limit": 1_000_000})
            fig["prune_plan_listing_all_s"] = round(time.perf_counter() - t, 2)
            fig["during_prune_plan_listing_all_mib"] = peak["peak_VmRSS"]
            assert whole.status_code == 200 and len(whole.json()["delete"]) == fig["prune_planned"]
            del whole
            fig["after_prune_plan_listing_all_mib"] = settled(server.pid)

        if shutil.which("wrk"):
            # Whether the first integrity pass (it reads every entry, throttled) still runs beside the pages.
            loops = httpx.get(f"{base}/readyz", timeout=30).json().get("loops", {})
            fig["verify_done_before_pages"] = bool(loops.get("verify", {}).get("last_success_s"))
            # A first pass at 1M reads every entry at JAXCACHE_VERIFY_BYTES_PER_S, longer than the phases above.
            fig["verify_running_during_pages"] = bool(loops.get("verify", {}).get("running_since_s"))
            pages = distinct_pages(base, 100)
            cold = wrk_cycle(base, pages, args.clients, args.seconds, work)
            health = wrk(base + "/healthz", args.clients, 4)
            fig["distinct_pages"] = len(pages)
            fig["distinct_p50_ms"] = round(cold["p50"] * 1000, 1)
            fig["distinct_p99_ms"] = round(cold["p99"] * 1000, 1)
            fig["healthz_p99_ms"] = round(health["p99"] * 1000, 1)
        else:
            print("wrk not found (apt-get install wrk): no listing latency under load", file=sys.stderr)
        fig["end_mib"] = memory(server.pid)
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(fig, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
