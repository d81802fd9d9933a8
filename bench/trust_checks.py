"""What #72's checks cost a call: each check's public entry point timed on the code before them and on the code
after, each side in an interpreter of its own importing only the checkout given. Figures, not assertions.

    mkdir -p /tmp/t-old && git archive 60104b8 core client warmup service | tar -x -C /tmp/t-old
    .venv/bin/python bench/trust_checks.py --before /tmp/t-old                 # after: this checkout's code
    .venv/bin/python bench/trust_checks.py --before /tmp/t-old --after /tmp/t-new --json

Both sides' interpreters run at once and take turns, batch by batch, so that a busy machine's drift falls on both
alike. A row is the median, over ``--repeat`` batches, of the mean time of one call in a batch of many calls (as
many as take about ``--target-ms``); after/before is the median of the batches' ratios. A call a side does not have
prints "-". Every figure and batch goes to bench/out/trust_checks.json. README.md says what each row measures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

_HERE = os.path.dirname(os.path.abspath(__file__))
_PARTS = ("core", "client", "warmup", "service")

# (key, what the row times): the table's rows, in order.
ROWS = (
    ("check_cache_dir", "client check_cache_dir, local dir"),
    ("check_cache_dir_link", "client check_cache_dir, through own link"),
    ("trust_check", "client trust.check (enable_cache's)"),
    ("resolve", "client options.resolve (enable_cache's)"),
    ("tier_named", "tier open_dir, JAXCACHE_LOCAL_DIR named"),
    ("tier_default", "tier open_dir, default candidate"),
    ("topology_gpu", "parse_any_topology 4x8x1"),
    ("topology_tpu", "parse_any_topology v5e:4x8"),
    ("topology_multi", "parse_any_topology 2xv5e:16x16@2x2"),
    ("duration", "parse_duration 14d"),
    ("size", "parse_bytes 2.5GiB"),
    ("parse_int", "numbers.parse_int 8"),
    ("targets", "warmup targets.read_file, 4 targets"),
    ("read_named", "storage.named.read_named, 61 bytes"),
    ("load_key", "signing.load_key"),
    ("content_coding", "storage.base.content_coding(None)"),
    ("without_userinfo", "storage.base.without_userinfo(URL)"),
    ("check_endpoint", "storage.base.check_endpoint"),
    ("s3_read", "S3Storage.read, 1 KiB object (moto)"),
    ("s3_setup", "S3Storage(bucket, prefix) (moto)"),
)
_BUCKET = "trust-bench"


# --------------------------------------------------------------------------------------------------------------
# A side: one interpreter, the jaxcache of --code only.


def _use_code(code: str | None) -> None:
    """Import jaxcache from ``code`` alone: the installed parts (editable paths to this checkout) would otherwise join
    the namespace package, and a module the checkout lacks would be found there."""
    if code is None:
        return
    sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "jaxcache"))]
    sys.path[:0] = [os.path.join(os.path.abspath(code), part) for part in _PARTS]


class _Timed:
    """One row's call on one side: its batch size is chosen on the first repetition asked for, so that a batch
    takes about ``target_s``."""

    def __init__(self, fn: Callable[[], object], target_s: float) -> None:
        self.fn, self.target_s, self.calls = fn, target_s, 0

    def repetition(self) -> float:
        """The mean time of one call, in µs, over a batch."""
        if not self.calls:
            self.fn()  # once untimed: imports, caches, and that it works at all
            t = time.perf_counter()
            self.fn()
            self.calls = max(1, min(20000, int(self.target_s / max(time.perf_counter() - t, 1e-7))))
        t = time.perf_counter()
        for _ in range(self.calls):
            self.fn()
        return (time.perf_counter() - t) / self.calls * 1e6


@contextmanager
def _mock_s3() -> Iterator[bool]:
    """moto's S3 in this process (no server, no HTTP) with an empty bucket; False where moto is not installed."""
    for name in [k for k in os.environ if k.startswith("AWS_") and k != "AWS_CA_BUNDLE"]:
        del os.environ[name]  # the store named by this test's settings, nobody's profile or endpoint
    try:
        import boto3
        from moto import mock_aws
    except ImportError:
        yield False
        return
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=_BUCKET)
        yield True


def _calls(tmp: str) -> Iterator[tuple[str, Callable[[], Callable[[], object]]]]:
    """Each row's key and what makes its call (raising ImportError or AttributeError where this side has none)."""
    cache = os.path.join(tmp, "home", "user", "cache")
    os.makedirs(cache, mode=0o700)
    link = os.path.join(tmp, "home", "user", "cache-link")
    os.symlink(cache, link)  # this user's: taken
    tier_base = os.path.join(tmp, "home", "user", "tier")
    os.makedirs(tier_base, mode=0o700)
    targets = os.path.join(tmp, "targets.txt")
    with open(targets, "w") as f:
        f.write("# the release's shapes\nv5e:4x8\n2xv5e:16x16\nv5p:2x2x2  # the small one\n4x8x1\n")
    small = os.path.join(tmp, "small.txt")
    with open(small, "w") as f:
        f.write("x" * 60 + "\n")
    key = os.path.join(tmp, "bench.key")

    def check_cache_dir() -> Callable[[], object]:
        from jaxcache.client.options import check_cache_dir as check
        return lambda: check(cache)

    def check_cache_dir_link() -> Callable[[], object]:
        from jaxcache.client.options import check_cache_dir as check
        return lambda: check(link)

    def trust_check() -> Callable[[], object]:
        from jaxcache.client import trust
        return lambda: trust.check(cache, mode="strict", in_object_store=False)

    def resolve() -> Callable[[], object]:
        from jaxcache.client.options import resolve as resolve_
        return lambda: resolve_(cache, job="bench", min_compile_time_secs=None, min_entry_size_bytes=None,
                                xla_caches=None, max_size_bytes=None, service_url=None, token=None, trust="strict",
                                default_xla_caches=None, env={"JAXCACHE_PREFETCH": "8"})

    def tier(named: bool) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            from jaxcache.client.tier_dir import open_dir
            return lambda: open_dir((tier_base,), "unchecked", "strict", named=named)
        return make

    def topology(text: str) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            from jaxcache.topology import parse_any_topology
            return lambda: parse_any_topology(text)
        return make

    def duration() -> Callable[[], object]:
        from jaxcache.units import parse_duration
        return lambda: parse_duration("14d")

    def size() -> Callable[[], object]:
        from jaxcache.units import parse_bytes
        return lambda: parse_bytes("2.5GiB")

    def parse_int() -> Callable[[], object]:
        from jaxcache.numbers import parse_int as parse
        return lambda: parse("8", "JAXCACHE_PREFETCH", least=0, most=64)

    def read_targets() -> Callable[[], object]:
        from jaxcache.warmup.targets import read_file
        return lambda: read_file(targets)

    def read_named() -> Callable[[], object]:
        from jaxcache.storage.named import read_named as read
        return lambda: read(small, "--targets", 1 << 20)

    def load_key() -> Callable[[], object]:
        from jaxcache import signing
        if not os.path.exists(key):
            signing.new_key("bench", key)
        return lambda: signing.load_key(key)

    def content_coding() -> Callable[[], object]:
        from jaxcache.storage.base import content_coding as coding
        return lambda: coding(None)

    def without_userinfo() -> Callable[[], object]:
        from jaxcache.storage.base import without_userinfo as strip
        return lambda: strip("cannot reach S3 at http://user:secret@10.0.0.5:9000/ (timed out)")

    def check_endpoint() -> Callable[[], object]:
        from jaxcache.storage.base import check_endpoint as check
        return lambda: check("AWS_ENDPOINT_URL", "http://10.0.0.5:9000", "or unset it")

    yield from (("check_cache_dir", check_cache_dir), ("check_cache_dir_link", check_cache_dir_link),
                ("trust_check", trust_check), ("resolve", resolve), ("tier_named", tier(True)),
                ("tier_default", tier(False)), ("topology_gpu", topology("4x8x1")),
                ("topology_tpu", topology("v5e:4x8")), ("topology_multi", topology("2xv5e:16x16@2x2")),
                ("duration", duration), ("size", size), ("parse_int", parse_int), ("targets", read_targets),
                ("read_named", read_named), ("load_key", load_key), ("content_coding", content_coding),
                ("without_userinfo", without_userinfo), ("check_endpoint", check_endpoint))


def side(args: argparse.Namespace) -> None:
    """Set every row's call up, say so in a JSON line, then answer each row key read from stdin with one repetition's
    JSON line, until stdin ends."""
    _use_code(args.code)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the client's package imports JAX
    import jaxcache

    roots = sorted({os.path.dirname(os.path.abspath(p)) for p in jaxcache.__path__})
    target_s = args.target_ms / 1e3
    timed: dict[str, _Timed] = {}
    with tempfile.TemporaryDirectory(prefix="jaxcache-bench-trust-") as tmp, _mock_s3() as mocked:
        for name, make in _calls(tmp):
            try:
                timed[name] = _Timed(make(), target_s)
            except (ImportError, AttributeError):
                pass  # this side has no such call
        if mocked:
            from jaxcache.storage.s3 import S3Storage

            store = S3Storage(_BUCKET, "bench")
            store.write_atomic("obj", os.urandom(1024))
            timed["s3_read"] = _Timed(lambda: store.read("obj"), target_s)
            # A botocore client each (tens of ms): a few calls a batch.
            timed["s3_setup"] = _Timed(lambda: S3Storage(_BUCKET, "bench"), target_s)
        print(json.dumps({"code": args.code or "installed", "jaxcache_from": roots, "has": sorted(timed)}), flush=True)
        for line in sys.stdin:
            row = timed[line.strip()]
            us = row.repetition()
            print(json.dumps({"us": us, "calls": row.calls}), flush=True)


# --------------------------------------------------------------------------------------------------------------
# The parent: both sides at once, each in its own interpreter, their repetitions alternating row by row.


class Side:
    """A side's interpreter (``--side``), asked for one repetition at a time."""

    def __init__(self, code: str | None, args: argparse.Namespace, log: IO[str]) -> None:
        argv = [sys.executable, os.path.abspath(__file__), "--side", "--target-ms", str(args.target_ms)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("JAXCACHE_")}
        self.name = code or "this checkout (installed)"
        self.proc = subprocess.Popen(argv + (["--code", code] if code else []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        self.log = log
        self.info = self._answer()

    def _answer(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            sys.stderr.write(self.log.read()[-3000:])
            raise SystemExit(f"the side of {self.name} ended with exit code {self.proc.wait()}")
        answer: dict = json.loads(line)
        return answer

    def repetition(self, key: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure(args: argparse.Namespace) -> dict:
    load = [round(os.getloadavg()[0], 2)]
    began = time.perf_counter()
    with tempfile.TemporaryFile("w+") as before_log, tempfile.TemporaryFile("w+") as after_log:
        sides = {"before": Side(args.before, args, before_log), "after": Side(args.after, args, after_log)}
        rows: dict[str, dict] = {}
        try:
            for key, _ in ROWS:
                reps: dict[str, list[float]] = {"before": [], "after": []}
                calls: dict[str, int] = {}
                present = [arm for arm, s in sides.items() if key in s.info["has"]]
                for rep in range(args.repeat):
                    for arm in present if rep % 2 == 0 else present[::-1]:  # neither always first
                        got = sides[arm].repetition(key)
                        reps[arm].append(got["us"])
                        calls[arm] = got["calls"]
                row: dict = {arm: None if arm not in present else {
                    "us": statistics.median(reps[arm]), "calls": calls[arm], "reps_us": reps[arm]} for arm in sides}
                if len(present) == 2:
                    row["ratio"] = statistics.median(a / b for b, a in zip(reps["before"], reps["after"], strict=True))
                rows[key] = row
                print(f"  {key}: {', '.join(f'{arm} {_us(row[arm])}' for arm in sides)} µs", file=sys.stderr)
        finally:
            for s in sides.values():
                s.close()
    load.append(round(os.getloadavg()[0], 2))
    return {"repeat": args.repeat, "target_ms": args.target_ms, "load_average": load,
            "elapsed_s": round(time.perf_counter() - began, 1),
            "sides": {arm: s.info for arm, s in sides.items()}, "rows": rows}


def _us(row: dict | None) -> str:
    if row is None:
        return "-"
    us = row["us"]
    return f"{us:,.0f}" if us >= 100 else f"{us:.2f}"


def table(fig: dict) -> None:
    from tables import print_rows

    rows = [["check", "before µs", "after µs", "after/before"]]
    for key, label in ROWS:
        row = fig["rows"][key]
        rows.append([label, _us(row["before"]), _us(row["after"]), f"{row['ratio']:.2f}" if "ratio" in row else "-"])
    print_rows(rows)
    sides, load = fig["sides"], fig["load_average"]
    print(f"\nbefore: {sides['before']['code']}; after: {sides['after']['code']}; each row the median of"
          f" {fig['repeat']} batches of about {fig['target_ms']:g} ms a side, the sides' batches alternating;"
          f" after/before: the median of the batches' ratios. Load average {load[0]} to {load[1]},"
          f" {fig['elapsed_s']:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/trust_checks.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", metavar="DIR", help="a checkout of the code before the checks (core, client, warmup)")
    ap.add_argument("--after", metavar="DIR", help="a checkout of the code after (default: this checkout, installed)")
    ap.add_argument("--code", metavar="DIR", help="with --side: the checkout whose jaxcache is imported")
    ap.add_argument("--side", action="store_true", help="one side's interpreter, which the run starts for each")
    ap.add_argument("--repeat", type=int, default=15, help="batches of each call a side (default 15)")
    ap.add_argument("--target-ms", type=float, default=50.0, help="about how long one batch takes (default 50)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    ap.add_argument("--out", default=os.path.join(_HERE, "out", "trust_checks.json"),
                    help="the figures and every batch as JSON (default bench/out/trust_checks.json)")
    args = ap.parse_args()
    if args.side:
        side(args)
        return 0
    if not args.before:
        ap.error("--before DIR: the code before the checks")
    if args.repeat < 1 or args.target_ms <= 0:
        ap.error("--repeat must be >= 1, --target-ms > 0")
    sys.path.insert(0, _HERE)
    from tables import emit

    emit(measure(args), args.out, args.json, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
