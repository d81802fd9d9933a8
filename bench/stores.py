"""`jaxcache ls`/`stats` of an object-store root, first call (head index emptied) and second, against the store's own
listing tool in the same run, on each store's emulator (started as tests/store_servers.py starts it): gs:// against
`gcloud storage ls -l`/`du -s`, s3:// against `aws s3 ls --recursive [--summarize]` (awscli in .venv-awscli: `make
.venv-awscli/.stamp`), az:// against the Azure SDK's `list_blobs` loop (az_list.py). The same entries on every store;
fresh processes, alternating; medians. Warm-index outputs must equal `--no-index` ones. README.md says the rest.

    .venv/bin/python bench/stores.py                              # every store, 5000 entries, 5 rounds
    .venv/bin/python bench/stores.py --store gs --entries 20000 --repeat 3      # one store; --json for figures
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.join(_REPO, "tests"))
from entries import Progress, key_of, load_sources, make_source  # noqa: E402
from tables import emit, print_rows  # noqa: E402

from store_servers import STARTERS, Server  # noqa: E402

_TARGET_RATIO = 1.5
_JAXCACHE = os.path.join(os.path.dirname(sys.executable), "jaxcache")
_AWS = os.path.join(_REPO, ".venv-awscli", "bin", "aws")
_BUCKET, _PREFIX = "bench", "cache"


@dataclass(frozen=True)
class Tools:
    """A store's own listing tool: a plain listing of the prefix and a sum of its sizes, the environment they run
    in, and how many objects a listing's output counts."""

    ls_label: str
    ls: list[str]
    sum_label: str
    sum: list[str]
    env: dict[str, str]
    counted: Callable[[bytes], int]


def _count(pattern: bytes) -> Callable[[bytes], int]:
    def counted(out: bytes) -> int:
        found = re.search(pattern, out)
        return int(found.group(1)) if found else -1

    return counted


def _gcloud(workdir: str, server: Server) -> Tools:
    """gcloud with a throwaway configuration that talks to the emulator without credentials."""
    env = {**os.environ, "CLOUDSDK_CONFIG": os.path.join(workdir, "gcloud"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    for prop, value in (("api_endpoint_overrides/storage", f"{server.url}/storage/v1/"),
                        ("auth/disable_credentials", "true"), ("core/project", "test")):
        subprocess.run(["gcloud", "config", "set", prop, value], env=env, check=True, capture_output=True)
    root = f"gs://{_BUCKET}/{_PREFIX}"
    return Tools("gcloud storage ls -l", ["gcloud", "storage", "ls", "-l", f"{root}/"],
                 "gcloud storage du -s", ["gcloud", "storage", "du", "-s", root], env, _count(rb"TOTAL: (\d+) objects"))


def _awscli(aws: str) -> Tools:
    root = f"s3://{_BUCKET}/{_PREFIX}/"
    ls = [aws, "s3", "ls", "--recursive", root]
    return Tools("aws s3 ls --recursive", ls, "aws s3 ls --recursive --summarize", [*ls, "--summarize"],
                 dict(os.environ), lambda out: out.count(b"\n"))


def _sdk_listing() -> Tools:
    ls = [sys.executable, os.path.join(_HERE, "az_list.py"), _BUCKET, f"{_PREFIX}/"]
    return Tools("SDK list_blobs loop", ls, "SDK list_blobs loop, summed", [*ls, "--sum"], dict(os.environ),
                 _count(rb"(\d+) objects, \d+ bytes"))


def _make_bucket(scheme: str) -> None:
    """The bucket (container), through the store's own client library."""
    if scheme == "gs":
        from google.cloud import storage

        storage.Client().create_bucket(_BUCKET)
    elif scheme == "s3":
        import boto3

        boto3.client("s3").create_bucket(Bucket=_BUCKET)
    else:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]).create_container(
            _BUCKET)


def fill(scheme: str, sources: list[tuple[str, bytes]], entries: int, atime: bool) -> None:
    """``entries`` real-format entries under ``scheme://bench/cache/`` (with -atime objects if ``atime``), 16 at a
    time, written as jaxcache writes objects (the same bytes on every store)."""
    from jaxcache.storage import open_storage

    _make_bucket(scheme)
    root = open_storage(f"{scheme}://{_BUCKET}/{_PREFIX}")
    progress = Progress(entries, f"uploading {entries} entries to {scheme}://")

    def put(i: int) -> None:
        module, data = sources[i % len(sources)]
        key = key_of(module, i)
        root.write_atomic(f"{key}-cache", data)
        if atime:
            root.write_atomic(f"{key}-atime", time.time_ns().to_bytes(8, "little"))

    try:
        with ThreadPoolExecutor(16) as pool:
            for _ in pool.map(put, range(entries)):
                progress.update()
    finally:
        progress.close()


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, bytes]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, check=True)
    return time.perf_counter() - start, proc.stdout


#: The jaxcache calls of a round, in order: (label, arguments after the root, whether the head index is emptied
#: first). `stats --heads` is what `stats` did by default before #61 (every head read); `ls --heads` after it finds
#: every head in the index.
_CALLS = (
    ("ls --json first", ["ls"], True),
    ("ls --json second", ["ls"], False),
    ("stats --json first", ["stats"], True),
    ("stats --json second", ["stats"], False),
    ("stats --heads --json first", ["stats", "--heads"], True),
    ("stats --heads --json second", ["stats", "--heads"], False),
    ("ls --heads --json second", ["ls", "--heads"], False),
)


def measure(scheme: str, tools: Tools, index_dir: str, entries: int, repeat: int) -> dict[str, list[float]]:
    root = f"{scheme}://{_BUCKET}/{_PREFIX}"
    env = {**os.environ, "JAXCACHE_INDEX_DIR": index_dir}
    env.pop("JAXCACHE_INDEX", None)
    runs: dict[str, list[float]] = {k: [] for k in (tools.ls_label, tools.sum_label, *(c[0] for c in _CALLS))}
    print(f"{scheme}: warm-up, one untimed {tools.ls_label}", file=sys.stderr)
    got = tools.counted(timed(tools.ls, tools.env)[1])
    assert got >= entries, f"{tools.ls_label} listed {got} objects, uploaded {entries}"
    for r in range(repeat):
        print(f"{scheme}: round {r + 1}/{repeat}", file=sys.stderr)
        for label, argv, empty in _CALLS:
            if label == "ls --json first":
                runs[tools.ls_label].append(timed(tools.ls, tools.env)[0])
            elif label == "stats --json first":
                runs[tools.sum_label].append(timed(tools.sum, tools.env)[0])
            if empty:
                shutil.rmtree(index_dir, ignore_errors=True)
            runs[label].append(timed([_JAXCACHE, argv[0], root, *argv[1:], "--json"], env)[0])
    # Not timed: with the index warm, the same answers as without one (which reads again what it needs).
    for _, argv, _ in _CALLS[::2]:
        cmd = [_JAXCACHE, argv[0], root, *argv[1:], "--json"]
        warm = json.loads(timed(cmd, env)[1])
        cold = json.loads(timed([*cmd, "--no-index"], env)[1])
        assert warm == cold, f"{' '.join(argv)} differs with the head index"
        got = len(warm["entries"]) if argv[0] == "ls" else warm["entries"]
        assert got == entries, f"{' '.join(argv)} counted {got} entries, uploaded {entries}"
        assert warm["heads_read"] is ("--heads" in argv), f"{' '.join(argv)} read heads: {warm['heads_read']}"
    return runs


def report(scheme: str, tools: Tools, runs: dict[str, list[float]], entries: int, repeat: int) -> dict:
    med = {k: statistics.median(v) for k, v in runs.items()}
    ls, total = med[tools.ls_label], med[tools.sum_label]
    heads = med["stats --heads --json first"] - med["ls --json first"]
    return {
        "store": scheme, "entries": entries, "repeat": repeat, "target_ratio": _TARGET_RATIO,
        "listing_tool": tools.ls_label, "sum_tool": tools.sum_label,
        "measurements": {k: {"median_s": v, "vs_listing": v / ls, "vs_sum": v / total, "runs": runs[k]}
                         for k, v in med.items()},
        "second_ls_vs_listing": med["ls --json second"] / ls,
        "first_stats_vs_sum": med["stats --json first"] / total,
        "second_stats_vs_sum": med["stats --json second"] / total,
        "first_ls_vs_listing": med["ls --json first"] / ls,
        "first_stats_heads_vs_sum": med["stats --heads --json first"] / total,
        # What reading every head adds to a first call (a GET or two per entry, 16 in flight), per entry.
        "head_ms_per_entry": heads * 1000 / entries,
    }


def print_store(fig: dict) -> None:
    ls, total = fig["listing_tool"], fig["sum_tool"]
    lines = [("measurement", "median s", f"vs {ls}", f"vs {total}")] + [
        (label, f"{row['median_s']:.3f}", f"{row['vs_listing']:.2f}x", f"{row['vs_sum']:.2f}x")
        for label, row in fig["measurements"].items()
    ]
    print(f"\n{fig['store']}://: {fig['entries']} entries; medians of {fig['repeat']} rounds, each a fresh process")
    print_rows(lines)
    t = fig["target_ratio"]
    print(f"second ls --json / {ls}: {fig['second_ls_vs_listing']:.2f} (target <= {t}); first stats --json / "
          f"{total}: {fig['first_stats_vs_sum']:.2f} (target <= {t})")
    print(f"first ls --json / {ls}: {fig['first_ls_vs_listing']:.2f}; second stats --json / {total}: "
          f"{fig['second_stats_vs_sum']:.2f}; first stats --heads / {total}: {fig['first_stats_heads_vs_sum']:.2f} "
          f"(heads: {fig['head_ms_per_entry']:.2f} ms an entry)")


def print_table(figs: dict) -> None:
    for fig in figs["stores"]:
        print_store(fig)


def run_store(scheme: str, args: argparse.Namespace, sources: list[tuple[str, bytes]], workdir: str) -> dict:
    """Start ``scheme``'s emulator, fill it, measure, stop it."""
    folder = Path(workdir, scheme)
    folder.mkdir()
    server = STARTERS[scheme](folder)
    try:
        with server.pointed_at():
            fill(scheme, sources, args.entries, args.atime)
            tools = (_gcloud(str(folder), server) if scheme == "gs" else _awscli(args.aws) if scheme == "s3"
                     else _sdk_listing())
            runs = measure(scheme, tools, str(folder / "index"), args.entries, args.repeat)
            return report(scheme, tools, runs, args.entries, args.repeat)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/stores.py",
        description="Time jaxcache ls/stats of an object-store root (first and repeated) against the store's own "
                    "listing tool, on each store's emulator, in one run.")
    parser.add_argument("--store", choices=sorted(STARTERS), action="append",
                        help="a store to measure (repeatable; default: gs, s3 and az, one after another)")
    parser.add_argument("--entries", type=int, default=5000, help="entries to upload (default 5000)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; medians are reported (default 5)")
    parser.add_argument("--atime", action="store_true",
                        help="upload an -atime object per entry too (JAX writes none on object stores unless a cache "
                             "size is set)")
    parser.add_argument("--source", metavar="DIR",
                        help="a real JAX cache dir to copy entries from (default: make one with jaxcache.warmup.demo)")
    parser.add_argument("--aws", default=_AWS, metavar="PATH", help=f"awscli's aws (default {_AWS})")
    parser.add_argument("--out", default=os.path.join(_HERE, "out", "stores.json"),
                        help="where to write the figures, every run included (default bench/out/stores.json)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    args = parser.parse_args(argv)
    if args.entries < 1 or args.repeat < 1:
        parser.error("--entries and --repeat must be at least 1")
    stores = args.store or ["gs", "s3", "az"]
    # The tools first: a missing one would otherwise end the run after the stores before it.
    if "gs" in stores and shutil.which("gcloud") is None:
        parser.error("gcloud not found: apt-get install google-cloud-cli")
    if "s3" in stores and not os.access(args.aws, os.X_OK):
        parser.error(f"no awscli at {args.aws}: make .venv-awscli/.stamp (or --aws PATH)")
    workdir = tempfile.mkdtemp(prefix="jaxcache-bench-stores-")
    began = time.perf_counter()
    try:
        sources = load_sources(args.source or make_source(workdir))
        figs = [run_store(scheme, args, sources, workdir) for scheme in stores]
    finally:
        print(f"finished in {time.perf_counter() - began:.0f}s", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
    emit({"stores": figs}, args.out, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
