"""What the benchmarks that run a service share about its catalog: a throwaway PostgreSQL server, and waiting
until the drain has folded every record the service accepted."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator


@contextlib.contextmanager
def postgres() -> Iterator[str | None]:
    """A throwaway PostgreSQL server (tests/postgres_support.py's), or None where its binaries are missing."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import pytest

    from postgres_support import launch

    try:
        with launch() as server:
            yield server.create_database()
    except pytest.skip.Exception as exc:
        print(f"PostgreSQL skipped: {exc}", file=sys.stderr)
        yield None


def wait_folded(base: str, timeout_s: float = 900.0) -> float:
    """Wait until no record waits in the service's inbox; the perf_counter time it was seen empty."""
    import httpx

    deadline = time.perf_counter() + timeout_s
    with httpx.Client(base_url=base, timeout=30) as client:
        while time.perf_counter() < deadline:
            if not any(c["reports_waiting"] for c in client.get("/v1/caches").json()["caches"]):
                return time.perf_counter()
            time.sleep(0.05)
    raise SystemExit(f"records still waiting in the inbox after {timeout_s} s")
