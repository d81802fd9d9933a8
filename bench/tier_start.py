"""The node-local tier's start with many copies (#58): ``LocalTier.revalidate`` (one listing of the root, then each
copy checked against it) of a tier holding ``--copies`` copies in front of a local root holding the same entries,
with this checkout's code (each copy's origin read and compared) and ``--baseline DIR``'s (a checkout of main: the
listing's names only), each run in a fresh process, alternating over ``--repeats`` rounds; the root's listing
alone (``list_stats``) in the same processes is the floor. A local root lists fastest, so the origins' share is
the largest here: on ``gs://`` the listing takes a request per 1,000 objects. Neither run may drop a copy. Also, in
this checkout's processes: the check the client makes before each of JAX's writes with its LRU on
(``JaxDir.heal`` finding nothing), against the eviction pass JAX itself makes inside that write
(``LRUCache._evict_if_needed``, nothing to evict) in the same directory.

    .venv/bin/python bench/tier_start.py --baseline /tmp/main --copies 10000   # README.md, "tier_start.py"
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
from entries import build_root, load_sources, make_source  # noqa: E402
from tables import print_rows  # noqa: E402

_PARTS = ("core", "client", "warmup", "service")


def child(tier: str, root: str) -> dict[str, float]:
    """One start's revalidation of ``tier`` against ``root``, timed, and the listing alone."""
    from jaxcache.client.local_tier import LocalTier
    from jaxcache.storage import LocalStorage

    storage = LocalStorage(root)
    started = time.perf_counter()
    storage.list_stats(("-cache", "-sig"))
    listing_s = time.perf_counter() - started
    local = LocalTier(tier, lambda: storage, policy=None, refused=lambda _k, _w: None, max_size_bytes=None)
    started = time.perf_counter()
    dropped = local.revalidate((), need_signature=False, pending=lambda: [])
    got = {"revalidate_s": time.perf_counter() - started, "listing_s": listing_s, "dropped": len(dropped)}
    try:
        from jaxcache.client.jax_dir import JaxDir
    except ImportError:  # the baseline's checkout: no check before JAX's writes
        return got
    from jax._src.lru_cache import LRUCache

    started = time.perf_counter()
    healed = JaxDir(tier, max_size_bytes=1 << 60).heal()
    got["heal_check_s"] = time.perf_counter() - started
    started = time.perf_counter()
    LRUCache(tier, max_size=1 << 60)._evict_if_needed()
    got["jax_eviction_s"] = time.perf_counter() - started
    assert not healed
    return got


def build(work: str, source: str, copies: int) -> tuple[str, str]:
    """A root of ``copies`` real-format entries and a tier holding a copy of each (a hard link), with its ``-atime``
    and its origin (what this checkout's client writes on admission)."""
    from jaxcache.client.origins import Origin, Origins, stat_of
    from jaxcache.storage import LocalStorage

    root, tier = os.path.join(work, "root"), os.path.join(work, "tier")
    build_root(load_sources(source), root, copies)
    os.makedirs(tier)
    origins, storage = Origins(tier), LocalStorage(root)
    for name in os.listdir(root):
        os.link(os.path.join(root, name), os.path.join(tier, name))
        if name.endswith("-cache"):
            info = storage.stat(name)
            assert info is not None
            origins.write(name.removesuffix("-cache"), Origin(stat_of(info)))
    return tier, root


def run(checkout: str | None, tier: str, root: str) -> dict[str, float]:
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(os.path.join(checkout, part) for part in _PARTS)
    out = subprocess.run([sys.executable, __file__, "--child", tier, root], capture_output=True, text=True,
                         env=env, check=True)
    got: dict[str, float] = json.loads(out.stdout)
    if got["dropped"]:
        raise SystemExit(f"a revalidation dropped {got['dropped']} copies: the tier and the root must agree")
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--baseline", help="a checkout of main (git archive main | tar -x -C DIR): required")
    parser.add_argument("--source", help="a directory of real JAX entries (default: jaxcache.warmup.demo's)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("TIER", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    if not args.baseline:
        parser.error("--baseline DIR: the checkout whose revalidation is the baseline")
    work = tempfile.mkdtemp(prefix="jaxcache-tier-start-")
    try:
        tier, root = build(work, args.source or make_source(work), args.copies)
        arms: dict[str, list[dict[str, float]]] = {"this checkout": [], "baseline": []}
        for r in range(args.repeats):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for arm in order:
                arms[arm].append(run(None if arm == "this checkout" else args.baseline, tier, root))
        med = {arm: {k: statistics.median(f[k] for f in figs) for k in figs[0] if k.endswith("_s")}
               for arm, figs in arms.items()}
        ratio = med["this checkout"]["revalidate_s"] / med["baseline"]["revalidate_s"]
        per_copy_us = (med["this checkout"]["revalidate_s"] - med["baseline"]["revalidate_s"]) / args.copies * 1e6
        heal_ratio = med["this checkout"]["heal_check_s"] / med["this checkout"]["jax_eviction_s"]
        figures = {"copies": args.copies, "repeats": args.repeats, "medians": med, "ratio": ratio,
                   "per_copy_us": per_copy_us, "heal_check_vs_jax_eviction": heal_ratio,
                   "rounds": {arm: [round(f["revalidate_s"], 4) for f in figs] for arm, figs in arms.items()}}
        if args.json:
            print(json.dumps(figures, indent=2))
        else:
            print_rows([["arm", "revalidate s (median)", "listing alone s", "per round"],
                        *[[arm, f"{m['revalidate_s']:.4f}", f"{m['listing_s']:.4f}",
                           ", ".join(f"{x:.3f}" for x in figures["rounds"][arm])] for arm, m in med.items()]])
            print(f"this checkout / baseline: {ratio:.2f}x; {per_copy_us:.1f} us more per copy")
            mine = med["this checkout"]
            print(f"check before each of JAX's writes: {mine['heal_check_s']:.4f} s, JAX's own eviction pass"
                  f" {mine['jax_eviction_s']:.4f} s ({heal_ratio:.2f}x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
