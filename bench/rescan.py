"""The service's rescan of an unchanged root, a process's first (it reads the catalog) and its periodic ones,
against a raw ``scandir`` + ``stat`` pass in the same process. Figures, not assertions.

    .venv/bin/python bench/rescan.py --entries 100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from entries import build_root as build  # noqa: E402
from entries import load_sources, make_source


def baseline(root: str) -> dict:
    t = time.perf_counter()
    n = 0
    with os.scandir(root) as it:
        for de in it:
            de.stat()
            n += 1
    return {"seconds": time.perf_counter() - t, "files": n}


def child(kind: str, root: str, db: str, repeat: int = 1) -> dict:
    """``fill``: one rescan; ``rescans``: a baseline pass and a rescan, ``repeat`` times in this process."""
    from jaxcache.service.catalog.database import Catalog
    from jaxcache.service.catalog.models import CacheRow
    from jaxcache.service.rounds import rescan
    from jaxcache.storage import open_storage

    # "first": a restarted process with the listing the last rescan kept on disk; "cold": without one.
    catalog = Catalog(db, snapshot_dir=None if kind == "cold" else os.path.join(os.path.dirname(root), "kept"))
    storage = open_storage(root)
    with catalog.session() as s:
        if s.get(CacheRow, "bench") is None:
            s.add(CacheRow(name="bench", url=root))
    out: dict[str, list] = {"baseline": [], "rescan": []}
    for _ in range(1 if kind == "fill" else repeat):
        if kind != "fill":
            out["baseline"].append(baseline(root))
        t = time.perf_counter()
        r = rescan(catalog, "bench", storage)
        out["rescan"].append({"seconds": time.perf_counter() - t, "entries": r.entries, "added": r.added,
                              "removed": r.removed, "updated": r.updated})
    return out


def run(kind: str, root: str, db: str, repeat: int = 1) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, root, db, str(repeat)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--source", help="a real JAX cache dir to copy entries from (default: jaxcache.warmup.demo)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, root, db, repeat = args.child
        print(json.dumps(child(kind, root, db, int(repeat))))
        return 0
    work = tempfile.mkdtemp(prefix="jaxcache-bench-rescan-")
    try:
        root = os.path.join(work, "cache")
        build(load_sources(args.source or make_source(work)), root, args.entries)
        db = f"sqlite:///{work}/catalog.sqlite"
        fill = run("fill", root, db)["rescan"][0]  # fills the catalog (and warms the page cache)
        assert fill["added"] == args.entries, fill
        firsts = [run("first", root, db, 1) for _ in range(args.repeat)]  # each a fresh process
        colds = [run("cold", root, db, 1) for _ in range(args.repeat)]  # likewise, reading the catalog's rows
        # One process: its first rescan reads the catalog, the others are the periodic case.
        periodic = run("periodic", root, db, args.repeat + 1)
        for r in [f["rescan"][0] for f in firsts + colds] + periodic["rescan"]:
            assert (r["added"], r["removed"], r["updated"]) == (0, 0, 0), r
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    first_base = med(f["baseline"][0]["seconds"] for f in firsts)
    first = med(f["rescan"][0]["seconds"] for f in firsts)
    cold_base = med(f["baseline"][0]["seconds"] for f in colds)
    cold = med(f["rescan"][0]["seconds"] for f in colds)
    per_base = med(r["seconds"] for r in periodic["baseline"][1:])
    per = med(r["seconds"] for r in periodic["rescan"][1:])
    fig = {"entries": args.entries, "files": periodic["baseline"][0]["files"],
           "fill_s": round(fill["seconds"], 3),
           "first_baseline_s": round(first_base, 3), "first_rescan_s": round(first, 3),
           "first_ratio": round(first / first_base, 2),
           "cold_baseline_s": round(cold_base, 3), "cold_rescan_s": round(cold, 3),
           "cold_ratio": round(cold / cold_base, 2),
           "baseline_s": round(per_base, 3), "rescan_s": round(per, 3), "ratio": round(per / per_base, 2)}
    if args.json:
        print(json.dumps(fig, indent=1))
        return 0
    print(f"{args.entries} entries ({fig['files']} files), medians of {args.repeat} runs")
    print(f"filling rescan (parses every entry, fills the catalog): {fig['fill_s']:.3f} s")
    print(f"first rescan in a restarted process (the listing kept on disk): {fig['first_rescan_s']:.3f} s against "
          f"scandir+stat {fig['first_baseline_s']:.3f} s: ratio {fig['first_ratio']:.2f} (target <= 1.5)")
    print(f"first rescan with nothing kept (reads the catalog's rows): {fig['cold_rescan_s']:.3f} s against "
          f"scandir+stat {fig['cold_baseline_s']:.3f} s: ratio {fig['cold_ratio']:.2f}")
    print(f"periodic rescan (the service's rounds): {fig['rescan_s']:.3f} s against scandir+stat "
          f"{fig['baseline_s']:.3f} s: ratio {fig['ratio']:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
