"""The service's rescan of a root whose run records are all ingested: a process's first (it lists every record)
against its later ones (settled days are not listed), in the same run. Figures, not assertions.

    .venv/bin/python bench/records.py --days 30 --per-day 100
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time


class Counting:
    """The storage, counting the objects its listings yield."""

    def __init__(self, inner) -> None:
        self.inner, self.objects = inner, 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def iter_objects(self, prefix: str = "", *, recursive: bool = False):
        for info in self.inner.iter_objects(prefix, recursive=recursive):
            self.objects += 1
            yield info


def build(root: str, days: int, per_day: int) -> int:
    """``days`` day folders of ``per_day`` final records each (two keys per process), dated by their day."""
    from jaxcache import records

    now = time.time()
    for d in range(days):
        started = now - d * 86400 - 3600
        for i in range(per_day):
            key = f"jit_f{i % 50}-{i:064x}"
            rec = records.RunRecord(
                job="bench", run_id=f"r{d}x{i}", process_index=0, process_count=1, host="h", started_at=started,
                updated_at=started + 60, final=True,
                fingerprint=records.Fingerprint(jax="0.12.0", jaxlib="0.12.0", backend="cpu"),
                keys=[records.KeyUsage(key=key, event=records.HIT, hits=2, first_at=started, last_at=started + 1),
                      records.KeyUsage(key=f"jit_w-{d * per_day + i:064x}", event=records.WRITE, writes=1,
                                       compile_s=1.5, first_at=started, last_at=started)])
            path = os.path.join(root, rec.name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(rec.to_json())
            os.utime(path, (started + 60, started + 60))
    return days * per_day


def timed(catalog, storage) -> dict:
    from jaxcache.service.rounds import rescan

    counting = Counting(storage)
    t = time.perf_counter()
    r = rescan(catalog, "bench", counting)
    return {"seconds": time.perf_counter() - t, "listed": counting.objects, "ingested": r.records_ingested}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--per-day", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import CacheRow
    from jaxcache.storage import open_storage

    work = tempfile.mkdtemp(prefix="jaxcache-bench-records-")
    try:
        root = os.path.join(work, "cache")
        os.makedirs(root)
        n = build(root, args.days, args.per_day)
        db = f"sqlite:///{work}/catalog.sqlite"
        storage = open_storage(root)
        catalog = Catalog(db)
        with catalog.session() as s:
            s.add(CacheRow(name="bench", url=storage.url))
        t = time.perf_counter()
        fill = timed(catalog, storage)
        fill["seconds"] = time.perf_counter() - t
        assert fill["ingested"] == n, fill
        timed(catalog, storage)  # lists each day once more (each changed at its first listing): then they settle
        catalog.dispose()
        firsts, laters = [], []
        for _ in range(args.repeat):
            catalog = Catalog(db)  # a fresh process: its first rescan lists every record
            firsts.append(timed(catalog, storage))
            laters.append(timed(catalog, storage))
            catalog.dispose()
        for r in firsts + laters:
            assert r["ingested"] == 0, r
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    first, later = med(r["seconds"] for r in firsts), med(r["seconds"] for r in laters)
    fig = {"records": n, "days": args.days, "fill_s": round(fill["seconds"], 3),
           "first_rescan_s": round(first, 4), "first_listed": firsts[0]["listed"],
           "later_rescan_s": round(later, 4), "later_listed": laters[0]["listed"],
           "ratio": round(later / first, 3)}
    if args.json:
        print(json.dumps(fig, indent=1))
        return 0
    print(f"{n} run records in {args.days} day folders, all ingested; medians of {args.repeat} runs")
    print(f"filling rescan (ingests every record): {fig['fill_s']:.3f} s")
    print(f"first rescan in a process (lists every record): {first:.4f} s, {fig['first_listed']} objects listed")
    print(f"later rescan (settled days not listed): {later:.4f} s, {fig['later_listed']} objects listed: "
          f"ratio {fig['ratio']:.3f} of the first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
