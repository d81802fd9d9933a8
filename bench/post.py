"""What a report's POST costs the service's process, without HTTP: the storm's final records (bench/reports.py's
job) handed straight to the app's ASGI callable, one at a time and then ``--concurrent`` at once, with no drain
(``--role api``) and an SQLite catalog (``--catalog postgresql``: a throwaway PostgreSQL server's, whose backends'
CPU is given too); milliseconds of wall and CPU per record. The storm's own figures vary by
more than a change to this path can show there. Figures, not assertions; what they mean: README.md.

    .venv/bin/python bench/post.py --records 600 --concurrent 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu as cpu_use  # noqa: E402
from catalogs import postgres  # noqa: E402
from reports import job_records  # noqa: E402


def request(app, body: bytes):
    """One ``POST /v1/reports?cache=bench`` of ``body`` through ``app``; its status."""

    async def call() -> int:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/reports", "raw_path": b"/v1/reports", "query_string": b"cache=bench",
                 "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {},
                 "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())]}
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        status: list[int] = []

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # no disconnect: the answer ends the call
            raise AssertionError

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await app(scope, receive, send)
        return status[0]

    return call()


async def measure(app, bodies: list[bytes], at_once: int) -> tuple[float, float, float]:
    """Wall, CPU and PostgreSQL's backends' CPU milliseconds per record, posting ``bodies`` ``at_once`` at a
    time."""
    gate = asyncio.Semaphore(at_once)

    async def one(body: bytes) -> int:
        async with gate:
            return await request(app, body)

    before = cpu_use.snapshot()
    wall, cpu = time.perf_counter(), time.process_time()
    statuses = await asyncio.gather(*(one(b) for b in bodies))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    backends = cpu_use.by_role(before, cpu_use.snapshot(), os.getpid())["postgres"]
    if set(statuses) != {202}:
        raise RuntimeError(f"statuses {sorted(set(statuses))}: expected 202 only")
    return wall / len(bodies) * 1e3, cpu / len(bodies) * 1e3, backends / len(bodies) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=600, help="final records per arm (processes of the job)")
    parser.add_argument("--keys", type=int, default=200, help="keys per record")
    parser.add_argument("--concurrent", type=int, default=32, help="POSTs at once in the second arm")
    parser.add_argument("--catalog", choices=("sqlite", "postgresql"), default="sqlite")
    args = parser.parse_args(argv)
    if args.catalog == "postgresql":
        with postgres() as url:
            return 1 if url is None else run(args, url)
    return run(args, None)


def run(args: argparse.Namespace, url: str | None) -> int:
    from jaxcache.service.app import create_app
    from jaxcache.service.settings import ServiceSettings

    records = job_records(["jit_train_step", "jit_eval_step"], 20_000, 2 * args.records, args.keys, final=True,
                          now=time.time())
    bodies = [r.to_json() for r in records]
    work = tempfile.mkdtemp(prefix="jaxcache-bench-post-")
    try:
        root = os.path.join(work, "cache")
        os.makedirs(root)
        app = create_app(ServiceSettings(caches={"bench": root}, db=url or f"sqlite:///{work}/catalog.sqlite",
                                         insecure_no_auth=True, role="api", rescan_s=86400))
        half = len(bodies) // 2
        print(f"{half} final records of {args.keys} keys an arm ({len(bodies[0]) / 1024:.1f} KiB each), "
              f"{args.catalog} catalog, no drain; {os.cpu_count()} CPUs")
        for label, part, at_once in (("one at a time", bodies[:half], 1),
                                     (f"{args.concurrent} at once", bodies[half:], args.concurrent)):
            wall, cpu, backends = asyncio.run(measure(app, part, at_once))
            print(f"  {label:14} {wall:6.2f} ms wall, {cpu:6.2f} ms CPU a record"
                  + (f" (PostgreSQL's backends: {backends:.2f} ms more)" if url else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
