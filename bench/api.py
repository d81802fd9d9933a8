"""Latency of the catalog service's API over N real-format entries under concurrent clients: repeated listing
pages, the same pages revalidated (``If-None-Match`` with their ``ETag``: answered 304), distinct pages and
``GET /healthz`` (the baseline) at ``--clients`` connections, then stats and ten single-entry DELETEs one at a
time; with ``--workers 1,2``, for each number of worker processes in turn over the same root and catalog. Figures,
not assertions; what each figure means: README.md.

    .venv/bin/python bench/api.py --entries 100000 --workers 1,2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from entries import build_root as build  # noqa: E402
from entries import load_sources, make_source
from serving import serve, settle

SORTS = ["size", "compile", "last_used", "created", "name"]


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def _load(base: str, clients: int, requests: int, paths: list[str]) -> list[float]:
    import httpx

    latencies: list[float] = []
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(paths[i % len(paths)])
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:

        async def worker() -> None:
            while not queue.empty():
                path = queue.get_nowait()
                t = time.perf_counter()
                r = await client.get(path)
                latencies.append(time.perf_counter() - t)
                if r.status_code != 200:
                    raise RuntimeError(f"{path}: {r.status_code} {r.text[:200]}")

        await asyncio.gather(*(worker() for _ in range(clients)))
    return latencies


_WRK_LINE = re.compile(r"^\s*(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def wrk(url: str, clients: int, seconds: int, *, script: str | None = None,
        header: str | None = None) -> dict[str, float]:
    """p50/p99 (seconds) and requests/s from one wrk run (a C load generator: it leaves the CPU to the server)."""
    extra = (["-s", script] if script else []) + (["-H", header] if header else [])
    out = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--latency", *extra, url],
                         check=True, capture_output=True, text=True).stdout
    got = {f"p{p}": float(v) * _UNIT[u] for p, v, u in _WRK_LINE.findall(out)}
    if "p50" not in got or "Socket errors" in out:
        print(f"wrk {url}:\n{out}", file=sys.stderr)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if non2xx:
        raise RuntimeError(f"{url}: {non2xx.group(1)} error responses")
    return {**got, "rps": float(rps.group(1)) if rps else 0.0}


def distinct_pages(base: str, per_sort: int) -> list[str]:
    """Up to ``per_sort`` consecutive cursor pages of each of three sorts: paths no two of which are the same."""
    import httpx

    paths = []
    with httpx.Client(base_url=base, timeout=30) as c:
        for sort, order in (("name", "asc"), ("size", "desc"), ("last_used", "asc")):
            path = f"/v1/caches/bench/entries?limit=100&sort={sort}&order={order}"
            for _ in range(per_sort):
                paths.append(path)
                cursor = c.get(path).json()["next_cursor"]
                if not cursor:
                    break
                path = f"/v1/caches/bench/entries?limit=100&sort={sort}&order={order}&cursor={cursor}"
    return paths


_CYCLE_LUA = """
local paths = {%s}
local i = 0
request = function()
  i = i + 1
  if i > #paths then i = 1 end
  return wrk.format("GET", paths[i])
end
"""


def wrk_cycle(base: str, paths: list[str], clients: int, seconds: int, work: str) -> dict[str, float]:
    """wrk over ``paths`` in turn (one wrk thread, so every connection takes the next path)."""
    script = os.path.join(work, "cycle.lua")
    with open(script, "w") as f:
        f.write(_CYCLE_LUA % ",".join(json.dumps(p) for p in paths))
    return wrk(base + "/", clients, seconds, script=script)


def paths_with_cursors(base: str) -> list[str]:
    import httpx

    paths = []
    with httpx.Client(base_url=base, timeout=30) as c:
        for sort, order in (("size", "desc"), ("last_used", "asc"), ("name", "asc")):
            first = f"/v1/caches/bench/entries?limit=100&sort={sort}&order={order}"
            paths.append(first)
            cursor = c.get(first).json()["next_cursor"]
            for _ in range(3):  # a page a few deep, where the root has one
                if not cursor:
                    break
                deeper = c.get(f"{first}&cursor={cursor}").json()["next_cursor"]
                if not deeper:
                    break
                cursor = deeper
            if cursor:
                paths.append(f"{first}&cursor={cursor}")
    return paths + ["/v1/caches/bench/entries?limit=100&function=jit_train*"]


def loadgen(base: str, clients: int, requests: int) -> dict:
    """Runs in its own process: gathers cursors, then measures."""
    import httpx

    rng = random.Random(0)
    paths = []
    with httpx.Client(base_url=base, timeout=30) as c:
        for sort in SORTS:
            for order in ("asc", "desc"):
                first = f"/v1/caches/bench/entries?limit=100&sort={sort}&order={order}"
                paths.append(first)
                cursor = c.get(first).json()["next_cursor"]
                for _ in range(5):  # a few pages deep, like a user paging; a small root has fewer
                    if not cursor:
                        break
                    paths.append(f"{first}&cursor={cursor}")
                    cursor = c.get(f"{first}&cursor={cursor}").json()["next_cursor"]
        paths.append("/v1/caches/bench/entries?limit=100&function=jit_train*")
        paths.append("/v1/caches/bench/entries?limit=100&min_size=10000&sort=size")
        rng.shuffle(paths)
        asyncio.run(_load(base, clients, clients * 4, paths))  # warm-up: connections, SQLite page cache
        entries = asyncio.run(_load(base, clients, requests, paths))
        health = asyncio.run(_load(base, clients, requests, ["/healthz"]))
        stats = []
        for _ in range(30):
            t = time.perf_counter()
            assert c.get("/v1/caches/bench/stats").status_code == 200
            stats.append(time.perf_counter() - t)
    return {"entries": entries, "healthz": health, "stats": stats}


def measure(base: str, args, work: str) -> dict:
    """Every phase against the service at ``base``."""
    import httpx

    fig: dict = {}
    if shutil.which("wrk"):
        fig["load_generator"] = "wrk"
        paths = paths_with_cursors(base)
        per_path = {p: wrk(base + p, args.clients, args.seconds) for p in paths}
        with httpx.Client(base_url=base, timeout=30) as c:
            tags = {p: c.get(p).headers["etag"] for p in paths}
        revalidated = {p: wrk(base + p, args.clients, args.seconds, header=f"If-None-Match: {tags[p]}")
                       for p in paths}
        health = wrk(base + "/healthz", args.clients, args.seconds)
        distinct = distinct_pages(base, args.distinct)
        cold = wrk_cycle(base, distinct, args.clients, args.seconds * 2, work)
        fig["distinct_pages"] = len(distinct)
        fig["distinct_p50_ms"] = round(cold["p50"] * 1000, 2)
        fig["distinct_p99_ms"] = round(cold["p99"] * 1000, 2)
        fig["distinct_rps"] = cold["rps"]
        fig["paths"] = {p: {"p50_ms": round(v["p50"] * 1000, 2), "p99_ms": round(v["p99"] * 1000, 2),
                            "rps": v["rps"]} for p, v in per_path.items()}
        fig["entries_p50_ms"] = round(statistics.median(v["p50"] for v in per_path.values()) * 1000, 2)
        fig["entries_p99_ms"] = round(max(v["p99"] for v in per_path.values()) * 1000, 2)
        fig["revalidated_p50_ms"] = round(statistics.median(v["p50"] for v in revalidated.values()) * 1000, 2)
        fig["revalidated_p99_ms"] = round(max(v["p99"] for v in revalidated.values()) * 1000, 2)
        fig["healthz_p50_ms"] = round(health.get("p50", 0) * 1000, 3)
        fig["healthz_p99_ms"] = round(health.get("p99", 0) * 1000, 3)
        stats = []
        with httpx.Client(base_url=base, timeout=30) as c:
            for _ in range(30):
                t = time.perf_counter()
                assert c.get("/v1/caches/bench/stats").status_code == 200
                stats.append(time.perf_counter() - t)
    else:
        # Without wrk the Python load generator saturates a 2-core machine before the server does.
        print("wrk not found (apt-get install wrk): using httpx, which understates the server", file=sys.stderr)
        fig["load_generator"] = "httpx"
        out = subprocess.run([sys.executable, __file__, "--loadgen", base, str(args.clients), str(args.requests)],
                             check=True, capture_output=True, text=True).stdout
        raw = json.loads(out)
        fig["entries_p50_ms"] = round(pct(raw["entries"], 50) * 1000, 2)
        fig["entries_p99_ms"] = round(pct(raw["entries"], 99) * 1000, 2)
        fig["healthz_p50_ms"] = round(pct(raw["healthz"], 50) * 1000, 2)
        fig["healthz_p99_ms"] = round(pct(raw["healthz"], 99) * 1000, 2)
        stats = raw["stats"]
    fig["stats_median_ms"] = round(statistics.median(stats) * 1000, 2)
    fig["stats_p99_ms"] = round(pct(stats, 99) * 1000, 2)
    # Last: it changes the entries. Each DELETE is answered before the cache's statistics are kept again.
    deletes = []
    with httpx.Client(base_url=base, timeout=600) as c:
        for entry in c.get("/v1/caches/bench/entries?limit=10&sort=size").json()["entries"]:
            t = time.perf_counter()
            assert c.delete(f"/v1/caches/bench/entries/{entry['key']}").status_code == 204
            deletes.append(time.perf_counter() - t)
    fig["delete_median_ms"] = round(statistics.median(deletes) * 1000, 2)
    fig["delete_max_ms"] = round(max(deletes) * 1000, 2)
    fig["entries_vs_healthz_p50"] = (
        round(fig["entries_p50_ms"] / fig["healthz_p50_ms"], 2) if fig["healthz_p50_ms"] else None
    )
    return fig


@contextlib.contextmanager
def service(root: str, work: str, workers: int | None, cpus: str | None = None):
    """`jaxcache serve` over ``root`` (``--workers`` unless None; on ``cpus`` only, if given); its base URL and
    seconds until ready."""
    started = time.perf_counter()
    with serve(root, f"sqlite:///{work}/catalog.sqlite", work, workers, cpus=cpus) as (base, _):
        ready_s = time.perf_counter() - started
        # Measured once the first integrity pass is done (a throttled read of every entry, minutes at 100k): its
        # thread would take the interpreter lock from the requests of whichever process runs it.
        if settle(base, 1800) is None:
            print("the background loops did not finish a round in 30 min: measuring anyway", file=sys.stderr)
        yield base, ready_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=3000, help="requests per phase (httpx fallback only)")
    parser.add_argument("--seconds", type=int, default=4, help="wrk duration per path")
    parser.add_argument("--source", help="a real JAX cache dir to copy entries from (default: jaxcache.warmup.demo)")
    parser.add_argument("--distinct", type=int, default=1000, help="distinct pages per sort in the distinct phase")
    parser.add_argument("--workers", default="",
                        help="comma-separated `jaxcache serve --workers` values to measure in turn over the same "
                             "root and catalog, e.g. 1,2 (default: the service's default)")
    parser.add_argument("--service-cpus", metavar="LIST",
                        help="run the service on these CPUs only (taskset -c, e.g. 0,1): on a machine with more "
                             "cores, start this script under taskset on the others, so wrk does not take the "
                             "service's CPU")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--loadgen", nargs=3, metavar=("BASE", "CLIENTS", "REQUESTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loadgen:
        base, clients, requests = args.loadgen
        print(json.dumps(loadgen(base, int(clients), int(requests))))
        return 0

    configs: list[int | None] = [int(w) for w in args.workers.split(",") if w.strip()] or [None]
    work = tempfile.mkdtemp(prefix="jaxcache-bench-api-")
    runs = []
    try:
        sources = load_sources(args.source or make_source(work))
        root = os.path.join(work, "cache")
        build(sources, root, args.entries)
        for workers in configs:
            with service(root, work, workers, args.service_cpus) as (base, ready_s):
                print(f"service (workers {workers or 'default'}) ready after {ready_s:.1f}s", file=sys.stderr)
                fig = {"entries": args.entries, "clients": args.clients, "workers": workers or "default",
                       "ready_s": round(ready_s, 2)}
                fig.update(measure(base, args, work))
                runs.append(fig)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(runs[0] if len(runs) == 1 else runs, indent=1))
        return 0
    for fig in runs:
        print(f"{args.entries} entries, {args.clients} concurrent clients, workers {fig['workers']}"
              f"{f' on CPUs {args.service_cpus}' if args.service_cpus else ''} ({os.cpu_count()} CPUs), load generator "
              f"{fig['load_generator']}; ready after {fig['ready_s']} s (the first includes the first scan)")
        for path, v in fig.get("paths", {}).items():
            print(f"  {path:90} p50 {v['p50_ms']:7.2f} ms  p99 {v['p99_ms']:7.2f} ms  {v['rps']:7.0f} req/s")
        print(f"{'request':34} {'p50 ms':>8} {'p99 ms':>8}   target")
        print(f"{'GET entries?limit=100 (median, max)':34} {fig['entries_p50_ms']:8.2f} {fig['entries_p99_ms']:8.2f}   "
              "p50 <= 20, p99 <= 100   repeated pages")
        if "revalidated_p50_ms" in fig:
            print(f"{'GET entries, If-None-Match (304)':34} {fig['revalidated_p50_ms']:8.2f} "
                  f"{fig['revalidated_p99_ms']:8.2f}   p99 <= 20")
        if "distinct_p50_ms" in fig:
            print(f"{'GET entries?limit=100 (distinct)':34} {fig['distinct_p50_ms']:8.2f} "
                  f"{fig['distinct_p99_ms']:8.2f}   p50 <= 20, p99 <= 100   {fig['distinct_pages']} pages in turn, "
                  f"{fig['distinct_rps']:.0f} req/s")
        print(f"{'GET /healthz (floor, same load)':34} {fig['healthz_p50_ms']:8.2f} {fig['healthz_p99_ms']:8.2f}")
        print(f"{'GET stats (sequential, median)':34} {fig['stats_median_ms']:8.2f} {fig['stats_p99_ms']:8.2f}   "
              "<= 100")
        print(f"{'DELETE one entry (10, median, max)':34} {fig['delete_median_ms']:8.2f} {fig['delete_max_ms']:8.2f}")
        print(f"entries/healthz p50 ratio: {fig['entries_vs_healthz_p50']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
