"""Rescan of an unchanged cache root by the service's catalog, against a raw ``scandir`` + ``stat`` pass.

The service rescans every root every ``JAXCACHE_RESCAN_S`` seconds; on a root where nothing changed that pass
must cost little more than listing the directory. This builds ``--entries`` real-format entries (each with an
``-atime``), fills a SQLite catalog with one untimed rescan, then times, each in a fresh process and alternating:

* ``baseline``: ``os.scandir`` + ``DirEntry.stat()`` over every file;
* ``rescan``: ``jaxcache.service.rescan.rescan`` of the unchanged root (list, pair, diff against the catalog).

Reports medians and the ratio (the issue's target: <= 1.5x). Figures, not assertions.

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
from api import build  # noqa: E402
from scan import load_sources, make_source  # noqa: E402


def child(kind: str, root: str, db: str) -> dict:
    if kind == "baseline":
        t = time.perf_counter()
        n = 0
        with os.scandir(root) as it:
            for de in it:
                de.stat()
                n += 1
        return {"seconds": time.perf_counter() - t, "files": n}
    from jaxcache.service.catalog import CacheRow, Catalog
    from jaxcache.service.rescan import rescan
    from jaxcache.storage import open_storage

    catalog = Catalog(db)
    storage = open_storage(root)
    with catalog.session() as s:
        if s.get(CacheRow, "bench") is None:
            s.add(CacheRow(name="bench", url=root))
    t = time.perf_counter()
    r = rescan(catalog, "bench", storage)
    return {"seconds": time.perf_counter() - t, "entries": r.entries, "added": r.added, "removed": r.removed,
            "updated": r.updated}


def run(kind: str, root: str, db: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, root, db], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--source", help="a real JAX cache dir to copy entries from (default: jaxcache.demo)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    work = tempfile.mkdtemp(prefix="jaxcache-bench-rescan-")
    try:
        root = os.path.join(work, "cache")
        build(load_sources(args.source or make_source(work)), root, args.entries)
        db = f"sqlite:///{work}/catalog.sqlite"
        first = run("rescan", root, db)  # fills the catalog (and warms the page cache)
        assert first["added"] == args.entries, first
        runs: dict[str, list[dict]] = {"baseline": [], "rescan": []}
        for _ in range(args.repeat):
            for kind in runs:
                runs[kind].append(run(kind, root, db))
        for r in runs["rescan"]:
            assert (r["added"], r["removed"], r["updated"]) == (0, 0, 0), r
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(r["seconds"] for r in runs["baseline"])
    resc = statistics.median(r["seconds"] for r in runs["rescan"])
    fig = {"entries": args.entries, "files": runs["baseline"][0]["files"], "first_rescan_s": round(first["seconds"], 3),
           "baseline_s": round(base, 3), "rescan_s": round(resc, 3), "ratio": round(resc / base, 2)}
    if args.json:
        print(json.dumps(fig, indent=1))
        return 0
    print(f"{args.entries} entries ({fig['files']} files), medians of {args.repeat} runs, each in a fresh process")
    print(f"first rescan (parses every entry, fills the catalog): {fig['first_rescan_s']:.3f} s")
    print(f"raw scandir+stat: {fig['baseline_s']:.3f} s   unchanged rescan: {fig['rescan_s']:.3f} s   "
          f"ratio {fig['ratio']:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
