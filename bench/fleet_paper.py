"""On paper: how long a bucket takes to serve a fleet's start, from one node's requests by kind (as a counting proxy
measured them, bench/request_kinds.py) and the store's published request rates. A bucket serves reads and writes
from separate budgets, so a fleet of ``nodes`` nodes needs ``nodes * reads / read rate`` seconds of the read budget
and ``nodes * writes / write rate`` of the write budget, the longer of the two being the bucket's time. Every read
kind counts against the read rate (listing pages, metadata, object bytes), as GCS documents; S3 documents GET and
HEAD, and a listing page is a GET of the bucket.

The rates are the ones a fleet meets at its start, before the store scales: GCS's initial rates per bucket (it
raises them as load persists, advising to at most double the rate every 20 minutes), S3's per partitioned prefix (a
cache root is one prefix until S3 partitions it, which takes it 30 to 60 minutes; beyond the rate it answers 503
SlowDown).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

READS = ("list", "head", "get", "other")
WRITES = ("put",)
NODES = (1_000, 10_000)
PAGE_OBJECTS = 1_000  # a listing page: S3's and GCS's default (and most) objects per page


@dataclass(frozen=True)
class Rates:
    store: str
    read_per_s: float
    write_per_s: float
    source: str


RATES = (
    Rates("GCS", 5_000, 1_000, "https://cloud.google.com/storage/docs/request-rate (initial rates per bucket)"),
    Rates("S3", 5_500, 3_500, "https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html"
                              " (per partitioned prefix)"),
)


def reads(per_node: Mapping[str, float]) -> float:
    return sum(per_node.get(k, 0.0) for k in READS)


def writes(per_node: Mapping[str, float]) -> float:
    return sum(per_node.get(k, 0.0) for k in WRITES)


def fleet_seconds(per_node: Mapping[str, float], nodes: int, rates: Rates) -> dict[str, float]:
    """Seconds of the bucket's read and write budgets ``nodes`` starts take, and the bucket's time (the longer)."""
    read_s = nodes * reads(per_node) / rates.read_per_s
    write_s = nodes * writes(per_node) / rates.write_per_s
    return {"read_s": read_s, "write_s": write_s, "seconds": max(read_s, write_s)}


def full_listing(per_node: Mapping[str, float], entries: int) -> dict[str, float]:
    """``per_node`` as it would be had the start listed the whole root: its listing pages of the root (those not of
    records) replaced by one a ``PAGE_OBJECTS`` entries."""
    root_pages = math.ceil(entries / PAGE_OBJECTS)
    return {**per_node, "list": per_node.get("list_records", 0.0) + root_pages}


def scenarios(measured: Mapping[str, Mapping[str, float]], entries: int, base: str | None = None
              ) -> dict[str, dict[str, float]]:
    """Per-node counts to put on paper: each measured arm as it is (with and without the pack), and from ``base``'s
    (an arm without the pack; the first measured when None) the same start with the old full listing."""
    out = {f"{arm} (measured)": dict(counts) for arm, counts in measured.items()}
    if measured:
        counts = measured[base] if base is not None else next(iter(measured.values()))
        out["full listing (measured, root pages = entries/1000)"] = full_listing(counts, entries)
    return out


def table(measured: Mapping[str, Mapping[str, float]], entries: int, rates_of: tuple[Rates, ...] = RATES,
          base: str | None = None) -> list[dict]:
    """One row per scenario (:func:`scenarios`) and store of ``rates_of``: per-node reads and writes, and the bucket's
    seconds at each of :data:`NODES`."""
    rows = []
    for name, per_node in scenarios(measured, entries, base).items():
        for rates in rates_of:
            rows.append({"scenario": name, "store": rates.store, "entries": entries, "reads_per_node": reads(per_node),
                         "writes_per_node": writes(per_node),
                         "nodes": {str(n): fleet_seconds(per_node, n, rates) for n in NODES}})
    return rows
