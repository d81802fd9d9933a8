"""A job's start on a large shared root, one node and a fleet (#71 item 5): the node-local tier, with and without the
job's pack, against plain JAX on roots of ``--sizes`` entries on each store's emulator (moto, fake-gcs-server,
Azurite), the requests a start makes by kind, a throttled fleet of ``--fleet-nodes`` nodes starting at once, the same
on paper for 1,000 and 10,000 nodes at GCS's and S3's published rates, and a job on a store that stops answering.
bench/README.md says how each is measured and why (JAX's import left out of the fleet's times: 32 imports on two
cores measure the CPU, not the store).

    .venv/bin/python bench/fleet_start.py                  # the whole matrix: 1k, 20k, 100k on s3, gs and az
    .venv/bin/python bench/fleet_start.py --quick --sizes 1000 --stores s3     # a check that it runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
sys.path.insert(0, _HERE)
sys.path.insert(1, os.path.join(_REPO, "tests"))
import fleet_paper  # noqa: E402
from coldstart import _client_changed, _env, _source_version  # noqa: E402
from fleet_roots import Bucket, filler, newest_record, other_records  # noqa: E402
from request_kinds import DETAILS, KINDS, count  # noqa: E402
from tables import emit, print_rows, save  # noqa: E402

from gcs_faults import GcsFaults  # noqa: E402
from ports import free_port  # noqa: E402
from store_faults import AzureFaults, S3Faults  # noqa: E402
from store_servers import STARTERS, NotInstalled, Server, azurite_connection_string  # noqa: E402

_WORKER = os.path.join(_HERE, "fleet_worker.py")
_PREFIX = "cache/"
_JOB = "fleet-bench"
_PACK = "fleet-bench-release"  # the job's working set, published as a pack after its first run
_PACK_ENV = {"JAXCACHE_PACK": _PACK}
_PROGRAMS = 5
_TARGET = 1.1  # tier / plain JAX, warm, at every size
_LOSS_TARGET_S = 30.0
_S3_READS_PER_S, _PAPER_FLEET = 5_500, 10_000  # the fleet's default rate: S3's per prefix, shared by this many
_PROXIES = {"s3": S3Faults, "gs": GcsFaults, "az": AzureFaults}
WARM_ARMS = ("tier, warm node", "tier, fresh node", "pack, warm node", "pack, fresh node", "plain JAX")
COLD_ARMS = ("tier, cold", "plain JAX, cold")
#: The environment a single node's arm adds to its job: the pack arms' jobs name the pack (a warm node's tier holds
#: its version already, a fresh node's is empty).
ARM_ENV: dict[str, dict[str, str]] = {"pack, warm node": _PACK_ENV, "pack, fresh node": _PACK_ENV}
#: The fleet's arms: the environment each adds to its nodes' jobs (every node's tier empty).
FLEET_ARMS: dict[str, dict[str, str]] = {"without the pack": {}, "with the pack": _PACK_ENV}
_PACK_SAID = re.compile(r"pack '[^']*' (seeded|held already|refused|not in the root|not read)")
FAULT_NODES = ("warm node", "fresh node")
FAULT_STORES = ("healthy", "stopped", "refused")


def endpoint_env(scheme: str, url: str) -> dict[str, str]:
    """The variables that point the store's client library (and fsspec's) at ``url``."""
    if scheme == "s3":
        return {"AWS_ENDPOINT_URL": url}
    if scheme == "gs":
        return {"STORAGE_EMULATOR_HOST": url}
    return {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(url)}


def rotated(arms: Sequence[str], r: int) -> list[str]:
    """Round ``r``'s order: no arm always first."""
    k = r % len(arms)
    return [*arms[k:], *arms[:k]]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between the nearest ranks."""
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@dataclass
class Store:
    """One store's emulator, the counting proxy in front of it, and the root of the size being measured: a bucket of
    its own for each size, so that every size starts from the same records (each start adds its run's record)."""

    scheme: str
    server: Server
    proxy: GcsFaults
    work: Path
    code: str | None
    fill_workers: int
    log_requests: bool
    bucket: Bucket | None = None
    entries: int = 0  # -cache objects in the root: filler and the job's
    salts: itertools.count = field(default_factory=lambda: itertools.count(1))

    def new_root(self, size: int) -> Path:
        """A new bucket for ``size``; the directory of its files on this machine (the nodes' tiers)."""
        self.bucket = Bucket(self.scheme, f"fleet-{size}", self.fill_workers)
        self.entries = 0
        folder = self.work / str(size)
        folder.mkdir()
        return folder

    @property
    def root(self) -> str:
        assert self.bucket is not None
        return f"{self.scheme}://{self.bucket.name}/{_PREFIX.rstrip('/')}"

    def env(self, url: str | None = None) -> dict[str, str]:
        """A job's environment: the developer's own store variables out, the emulator's in, its endpoint the proxy
        (or ``url``)."""
        base = {k: v for k, v in _env().items() if k not in self.server.replaces}
        env = {**base, **self.server.env, **endpoint_env(self.scheme, url or self.proxy.url),
               "XDG_CACHE_HOME": str(self.work / "xdg")}
        if self.code:  # the jaxcache a checkout holds, before the installed one
            env["PYTHONPATH"] = os.pathsep.join(os.path.join(self.code, p) for p in ("core", "client", "warmup"))
        return env


def pack_outcome(summary: str | None) -> str | None:
    """What a start did with the pack, from its summary line: ``seeded``, ``held already``, ``refused``, ``not in the
    root``, ``not read``; None when it named none."""
    found = _PACK_SAID.search(summary or "")
    return found.group(1) if found else None


def start(store: Store, arm: str, *, local_dir: Path | None = None, salt: int = 0, job: str = _JOB,
          gate: bool = False, url: str | None = None, extra: Mapping[str, str] | None = None
          ) -> tuple[subprocess.Popen, float]:
    """Start one job (its environment with ``arm``'s :data:`ARM_ENV` and ``extra``); the process and ``time.time()``
    just before it started."""
    tier = not arm.startswith("plain")
    env = {**store.env(url), **ARM_ENV.get(arm, {}), **(extra or {})}
    if tier:
        assert local_dir is not None
        env["JAXCACHE_LOCAL_DIR"] = str(local_dir)
    cmd = [sys.executable, _WORKER, "--arm", "tier" if tier else "plain", "--root", store.root, "--job", job,
           "--salt", str(salt), "--programs", str(_PROGRAMS)]
    if gate:
        cmd += ["--gate", "--watch"]
    launched = time.time()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if gate else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    return proc, launched


def finish(proc: subprocess.Popen, timeout_s: float) -> tuple[dict, float, str, bool]:
    """Wait for a job (killed past ``timeout_s``); its JSON line ({} if none, then ``programs_done`` and
    ``last_done_at`` from its progress lines), ``time.time()`` at its exit, its stderr, and whether it was killed."""
    killed = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        killed = True
    exited = time.time()
    lines = (out or "").splitlines()
    found = [ln for ln in lines if ln.startswith("{")]
    if found:
        return json.loads(found[-1]), exited, err or "", killed
    done = [float(ln.split()[2]) for ln in lines if ln.startswith("program ")]
    return {"programs_done": len(done), "last_done_at": max(done, default=None)}, exited, err or "", killed


def one(store: Store, arm: str, size: int, r: int, *, timeout_s: float = 1800, must_pass: bool = True,
        url: str | None = None, counted: bool = True, **kw) -> dict:
    """One start, measured: times from its launch, and its requests by kind (to done and to exit)."""
    proc, launched = start(store, arm, url=url, **kw)
    got, exited, err, killed = finish(proc, timeout_s)
    ended = "done_at" in got
    if must_pass and (proc.returncode != 0 or not ended):
        sys.stderr.write(err[-4000:])
        raise SystemExit(f"{store.scheme} {size}: a '{arm}' start failed with exit code {proc.returncode}")
    fig = {"store": store.scheme, "size": size, "entries": store.entries, "arm": arm, "round": r,
           "rc": proc.returncode, "killed": killed, "exit_s": exited - launched,
           "done_s": got["done_at"] - launched if ended else None,
           "first_s": got["first_at"] - launched if ended else None,
           "enable_s": got["enabled_at"] - got["go_at"] if ended else None,
           "import_s": got["imported_at"] - launched if ended else None,
           "programs_done": _PROGRAMS if ended else got["programs_done"],
           "last_done_s": got["last_done_at"] - launched if got.get("last_done_at") else None,
           "hits": got.get("hits"), "misses": got.get("misses"), "summary": got.get("summary"),
           "pack": pack_outcome(got.get("summary"))}
    if must_pass and ARM_ENV.get(arm) and fig["pack"] not in ("seeded", "held already"):
        raise SystemExit(f"{store.scheme} {size}: a '{arm}' start did not use the pack ({fig['pack']}): "
                         f"{fig['summary']}")
    if counted:
        logged = store.proxy.requests(launched, exited)
        fig["requests"] = count(store.scheme, logged)
        if store.log_requests:
            fig["request_log"] = logged
        fig["requests_to_done"] = count(store.scheme, store.proxy.requests(launched, got["done_at"])) if ended else None
    if not must_pass:
        fig["stderr_tail"] = err[-1500:]
    done = "-" if fig["done_s"] is None else f"{fig['done_s']:.2f}"
    print(f"  {store.scheme} {size:>7} r{r} {arm:18s} done {done:>7} s, exit {fig['exit_s']:7.2f} s, "
          f"{fig['hits']} hits {fig['misses']} misses"
          + (f", {fig['requests']['total']} requests" if counted else "") + (" KILLED" if killed else "")
          + (f", pack {fig['pack']}" if fig["pack"] else ""),
          file=sys.stderr)
    return fig


def grow(store: Store, need: int) -> dict:
    """``need`` filler objects in the root; what it took."""
    assert store.bucket is not None
    seconds = store.bucket.put_many(filler(_PREFIX, 0, need), need, f"{store.scheme}: {need} filler objects")
    store.entries += need
    print(f"{store.scheme}: {need} filler objects written in {seconds:.1f} s", file=sys.stderr)
    return {"filler_written": need, "filler_s": seconds, "filler_per_s": need / seconds if seconds else None}


def publish_pack(store: Store) -> dict:
    """The job's working set, from its runs, published into the root as the pack the pack arms name, as a release
    would (``jaxcache bundle export ROOT --job J --pack NAME``, the store reached directly)."""
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "jaxcache", "bundle", "export", store.root, "--job", _JOB, "--pack",
                           _PACK, "--json"], capture_output=True, text=True, env=store.env(store.server.url),
                          timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{store.scheme}: publishing the pack failed with exit code {proc.returncode}: "
                         f"{(proc.stderr or proc.stdout)[-3000:]}")
    got = json.loads(proc.stdout)
    if len(got["keys"]) != _PROGRAMS:
        raise SystemExit(f"{store.scheme}: the pack should hold the job's {_PROGRAMS} entries: {got}")
    print(f"{store.scheme}: pack {_PACK!r} published, {got['size_bytes']} bytes, {len(got['keys'])} entries",
          file=sys.stderr)
    return {"name": _PACK, "object": got["object"], "version": got["version"], "size_bytes": got["size_bytes"],
            "keys": len(got["keys"]), "publish_s": time.perf_counter() - began}


def seed(store: Store, size: int, folder: Path, args: argparse.Namespace) -> dict:
    """The job's first run (fills the root and the warm node's tier), other jobs' records beside its own, then the
    job's pack published and a start naming it on the pack's warm node (its tier then holds the pack's version)."""
    assert store.bucket is not None
    fig = one(store, "tier, cold", size, -1, local_dir=folder / "warm-node")
    if fig["misses"] != _PROGRAMS:
        raise SystemExit(f"{store.scheme}: the first run should compile {_PROGRAMS} programs: {fig['summary']}")
    store.entries += _PROGRAMS
    template = newest_record(store.bucket, _PREFIX, lambda rec: rec.get("job") == _JOB)
    records = other_records(_PREFIX, template, args.record_days, args.records_per_day, time.time())
    seconds = store.bucket.put_many(records, len(records), f"{store.scheme}: {len(records)} other jobs' records")
    pack = publish_pack(store)
    pack["first_start"] = one(store, "pack, fresh node", size, -1, local_dir=folder / "pack-warm-node")
    return {"first_run": fig, "other_records": len(records), "other_records_s": seconds, "pack": pack}


def warm_rounds(store: Store, size: int, folder: Path, args: argparse.Namespace) -> list[dict]:
    runs = []
    for r in range(args.repeats):
        for arm in rotated(WARM_ARMS, r):
            local = {"tier, warm node": folder / "warm-node", "tier, fresh node": folder / f"fresh-{r}",
                     "pack, warm node": folder / "pack-warm-node", "pack, fresh node": folder / f"pack-fresh-{r}"
                     }.get(arm)
            runs.append(one(store, arm, size, r, local_dir=local))
    return runs


def cold_rounds(store: Store, size: int, folder: Path, args: argparse.Namespace) -> list[dict]:
    runs = []
    for r in range(args.repeats):
        for arm in rotated(COLD_ARMS, r):
            salt = next(store.salts)
            runs.append(one(store, arm, size, r, salt=salt, job=f"fleet-cold-{salt}",
                            local_dir=folder / f"cold-{salt}"))
            store.entries += _PROGRAMS
    return runs


def fleet_round(store: Store, size: int, folder: Path, r: int, arm: str, args: argparse.Namespace) -> dict:
    """``--fleet-nodes`` nodes, imports done, started at one signal behind the throttling proxy."""
    slug = arm.replace(" ", "-")
    procs = []
    for n in range(args.fleet_nodes):
        # Every node on this machine's few cores gets a sliver of one: the default lookup deadline would take the
        # slow answers for a store that stopped answering, and the nodes would compile what they should load.
        extra = {**FLEET_ARMS[arm], "JAXCACHE_LOOKUP_DEADLINE_S": format(args.fleet_deadline_s, "g")}
        proc, _ = start(store, "tier", local_dir=folder / f"fleet-{r}-{slug}-{n}", gate=True, extra=extra)
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            for p in procs:
                p.kill()
            raise SystemExit(f"a fleet node failed before its start: {proc.communicate()[1][-3000:]}")
    store.proxy.throttle(args.fleet_rate)
    go_at = time.time()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results: list[tuple[dict, float, str, bool] | None] = [None] * len(procs)

    def wait(i: int) -> None:
        results[i] = finish(procs[i], args.fleet_timeout_s)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(len(procs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.proxy.throttle(None)
    nodes = []
    for proc, res in zip(procs, results, strict=True):
        assert res is not None
        got, exited, err, killed = res
        ended = "done_at" in got
        if not ended:
            sys.stderr.write(err[-2000:])
        nodes.append({"rc": proc.returncode, "killed": killed, "exit_s": exited - go_at,
                      "ready_s": got["done_at"] - go_at if ended else None,
                      "seeded_s": got["seeded_at"] - go_at if got.get("seeded_at") else None,
                      "enable_s": got["enabled_at"] - go_at if ended else None,
                      "hits": got.get("hits"), "misses": got.get("misses"), "summary": got.get("summary"),
                      "pack": pack_outcome(got.get("summary"))})
    last_exit = max(n["exit_s"] for n in nodes) + go_at
    ready = [n["ready_s"] for n in nodes if n["ready_s"] is not None]
    seeded = [n["seeded_s"] for n in nodes if n["seeded_s"] is not None]
    logged = store.proxy.requests(go_at, last_exit)
    fig = {"store": store.scheme, "size": size, "entries": store.entries, "arm": arm, "round": r,
           "nodes": args.fleet_nodes, "rate_per_s": args.fleet_rate, "failed": sum(n["ready_s"] is None for n in nodes),
           "ready_p50_s": percentile(ready, 50) if ready else None,
           "ready_p99_s": percentile(ready, 99) if ready else None,
           "seeded_p50_s": percentile(seeded, 50) if seeded else None,
           "seeded_p99_s": percentile(seeded, 99) if seeded else None, "seeded_nodes": len(seeded),
           "exit_p50_s": percentile([n["exit_s"] for n in nodes], 50),
           "exit_p99_s": percentile([n["exit_s"] for n in nodes], 99),
           "hits": sum(n["hits"] or 0 for n in nodes), "misses": sum(n["misses"] or 0 for n in nodes),
           "requests": count(store.scheme, logged),
           # What the nodes' starts asked of the bucket: the 503s the throttle answered are retried, so left out.
           "served": count(store.scheme, [e for e in logged if e[2] != 503]),
           "pack": dict(Counter(n["pack"] for n in nodes if n["pack"] is not None)),
           "requests_to_ready": count(store.scheme, store.proxy.requests(go_at, go_at + max(ready, default=0.0))),
           "per_node": nodes}
    p99 = "-" if fig["ready_p99_s"] is None else f"{fig['ready_p99_s']:.2f}"
    print(f"  fleet {size:>7} r{r} {arm}: ready p99 {p99} s, {fig['requests']['total']} requests "
          f"({fig['requests']['throttled']} throttled), {fig['hits']} hits {fig['misses']} misses, "
          f"{fig['failed']} failed" + "".join(f", pack {k}: {v}" for k, v in fig["pack"].items()), file=sys.stderr)
    return fig


def fault_rounds(store: Store, size: int, folder: Path, args: argparse.Namespace) -> list[dict]:
    """The tier arm's job on a healthy store, a stopped one and a closed port, each on a warm and a fresh node."""
    template = folder / "fault-warm"
    url = store.server.url
    one(store, "tier, fresh node", size, -1, local_dir=template, url=url, counted=False)  # a warm node's tier
    runs: list[dict] = []
    for r in range(args.fault_repeats):
        for node in FAULT_NODES:
            for kind in rotated(FAULT_STORES, r):
                if any(x["killed"] for x in runs if x["node"] == node and x["fault"] == kind):
                    continue  # past the bound once: conclusive, and another would cost the bound again
                local = folder / f"fault-{node.split()[0]}-{kind}-{r}"
                if node == "warm node":
                    shutil.copytree(template, local)
                target = f"http://127.0.0.1:{free_port()}" if kind == "refused" else url
                if kind == "stopped":
                    os.kill(store.server.proc.pid, signal.SIGSTOP)
                try:
                    fig = one(store, f"tier, {node}", size, r, local_dir=local, url=target, counted=False,
                              must_pass=False, timeout_s=args.fault_timeout_s)
                finally:
                    if kind == "stopped":
                        os.kill(store.server.proc.pid, signal.SIGCONT)
                fig.update(node=node, fault=kind)
                runs.append(fig)
    return runs


def med(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def summarize_starts(runs: list[dict], arms: Sequence[str], baseline: str) -> dict[str, dict]:
    """Per arm: medians of its starts' times and requests by kind, and its time against ``baseline``'s."""
    out: dict[str, dict] = {}
    for arm in arms:
        rs = [x for x in runs if x["arm"] == arm]
        if not rs:
            continue
        out[arm] = {"done_s": med([x["done_s"] for x in rs]), "exit_s": med([x["exit_s"] for x in rs]),
                    "runs_done_s": [round(x["done_s"], 2) for x in rs],
                    "hits_min": min(x["hits"] for x in rs), "misses_max": max(x["misses"] for x in rs),
                    "requests": {k: med([x["requests"][k] for x in rs]) for k in (*KINDS, *DETAILS, "total")},
                    "requests_to_done": {k: med([x["requests_to_done"][k] for x in rs]) for k in (*KINDS, "total")}}
    base = out.get(baseline)
    for a in out.values():
        a["vs_plain"] = a["done_s"] / base["done_s"] if base else None
        a["exit_vs_plain"] = a["exit_s"] / base["exit_s"] if base else None
    return out


def summarize_fleet(runs: list[dict]) -> dict[str, dict]:
    out = {}
    for arm in FLEET_ARMS:
        rs = [x for x in runs if x["arm"] == arm]
        if rs:
            out[arm] = {k: med([x[k] for x in rs]) for k in (
                "ready_p50_s", "ready_p99_s", "seeded_p50_s", "seeded_p99_s", "exit_p50_s", "exit_p99_s")}
            out[arm].update(requests={k: med([x["requests"][k] for x in rs]) for k in (*KINDS, "total", "throttled")},
                            per_node={k: med([x["served"][k] / x["nodes"] for x in rs]) for k in (*KINDS, *DETAILS)},
                            pack=dict(sum((Counter(x["pack"]) for x in rs), Counter())),
                            failed=sum(x["failed"] for x in rs), misses=sum(x["misses"] for x in rs),
                            hits=sum(x["hits"] for x in rs), rounds=len(rs), nodes=rs[0]["nodes"],
                            rate_per_s=rs[0]["rate_per_s"])
    return out


def summarize_faults(runs: list[dict]) -> list[dict]:
    rows = []
    for node in FAULT_NODES:
        healthy = med([x["exit_s"] for x in runs if x["node"] == node and x["fault"] == "healthy"])
        for kind in FAULT_STORES:
            rs = [x for x in runs if x["node"] == node and x["fault"] == kind]
            if not rs:
                continue
            exit_s = med([x["exit_s"] for x in rs])
            lost = None if exit_s is None or healthy is None else exit_s - healthy
            killed = sum(x["killed"] for x in rs)
            failed = sum(x["rc"] != 0 for x in rs)
            # A job that failed lost the job; one killed before the target's bound says nothing either way.
            met = (None if lost is None or kind == "healthy" or (killed and lost <= _LOSS_TARGET_S)
                   else not failed and lost <= _LOSS_TARGET_S)
            rows.append({"node": node, "fault": kind, "exit_s": exit_s, "done_s": med([x["done_s"] for x in rs]),
                         "lost_s": lost, "lost_at_least": killed > 0, "killed": killed, "failed": failed,
                         "runs": len(rs), "programs_done": [x["programs_done"] for x in rs],
                         "hits": [x["hits"] for x in rs], "misses": [x["misses"] for x in rs], "met": met})
    return rows


def paper(stores: dict[str, dict]) -> list[dict]:
    """The bucket's time for 1,000 and 10,000 nodes, per size, each arm measured (with and without the pack; a fleet
    node's served requests), and the old full listing from the first arm without the pack: GCS's rates with
    fake-gcs-server's counts, S3's with moto's (either store's counts where the other was not run)."""
    rows = []
    for rates in fleet_paper.RATES:
        scheme = "gs" if rates.store == "GCS" else "s3"
        source = stores.get(scheme) or next(iter(stores.values()), None)
        if source is None:
            continue
        for size, fig in source["sizes"].items():
            measured: dict[str, dict[str, float]] = {}
            unpacked: list[str] = []  # the arms whose jobs name no pack
            fleet = (stores.get("s3") or {}).get("sizes", {}).get(size, {}).get("fleet", {})
            for arm, f in fleet.items():
                measured[f"fleet node, {arm}"] = f["per_node"]
                if not FLEET_ARMS[arm]:
                    unpacked.append(f"fleet node, {arm}")
            for arm in WARM_ARMS:
                if arm in fig.get("warm", {}):
                    measured[arm] = fig["warm"][arm]["requests"]
                    if not ARM_ENV.get(arm):
                        unpacked.append(arm)
            base = unpacked[0] if unpacked else None
            for row in fleet_paper.table(measured, fig["entries"], (rates,), base):
                rows.append({**row, "size": size, "counted_on": source["scheme"]})
    return rows


def run_store(scheme: str, args: argparse.Namespace, work: Path, all_runs: list[dict]) -> dict:
    folder = work / scheme
    folder.mkdir()
    try:
        server = STARTERS[scheme](folder)
    except NotInstalled as exc:
        raise SystemExit(f"{scheme}: {exc}") from None
    proxy = None
    try:
        with server.pointed_at():
            proxy = _PROXIES[scheme](server.url)
            store = Store(scheme, server, proxy, folder, args.code, args.fill_workers, args.request_log)
            out: dict = {"scheme": scheme, "sizes": {}}
            for i, size in enumerate(args.sizes):
                print(f"{scheme}: size {size}", file=sys.stderr)
                here = store.new_root(size)
                fig: dict = {"root": store.root, "fill": grow(store, size - _PROGRAMS)}
                fig["seed"] = seed(store, size, here, args)
                fig["entries"] = store.entries
                if "warm" in args.parts:
                    runs = warm_rounds(store, size, here, args)
                    all_runs += runs
                    fig["warm"] = summarize_starts(runs, WARM_ARMS, "plain JAX")
                if "cold" in args.parts:
                    runs = cold_rounds(store, size, here, args)
                    all_runs += runs
                    fig["cold"] = summarize_starts(runs, COLD_ARMS, "plain JAX, cold")
                if "fleet" in args.parts and scheme == "s3" and size in args.fleet_sizes:
                    runs = [fleet_round(store, size, here, r, arm, args)
                            for r in range(args.repeats) for arm in rotated(list(FLEET_ARMS), r)]
                    all_runs += runs
                    fig["fleet"] = summarize_fleet(runs)
                out["sizes"][size] = fig
                if "faults" in args.parts and i == 0 and scheme in args.fault_stores:
                    runs = fault_rounds(store, size, here, args)
                    all_runs += runs
                    out["faults"] = {"size": size, "timeout_s": args.fault_timeout_s, "rows": summarize_faults(runs)}
            return out
    finally:
        if proxy is not None:
            proxy.close()
        server.stop()


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def print_table(fig: dict) -> None:
    print(f"\ncode {fig['version']}{' (changed during the run)' if fig['code_changed'] else ''}; "
          f"{fig['programs']} programs; medians of {fig['repeats']} rounds, each start a fresh process; time from "
          "process start; requests counted at the proxy, to exit")
    rows = [("warm start", "done s", "exit s", "vs plain", f"target <= {_TARGET}x", "hits", *KINDS, *DETAILS,
             "runs (done s)")]
    cold = [("cold start (writes five)", "done s", "exit s", "vs plain", "exit vs plain", "misses", "put", "total")]
    for scheme, st in fig["stores"].items():
        for size, s in st["sizes"].items():
            for arm, a in s.get("warm", {}).items():
                met = "-" if arm == "plain JAX" else "met" if a["vs_plain"] <= _TARGET else "NOT met"
                rows.append((f"{scheme} {size} ({s['entries']}) {arm}", _f(a["done_s"]), _f(a["exit_s"]),
                             f"{_f(a['vs_plain'])}x", met, str(a["hits_min"]),
                             *(_f(a["requests"][k], "g") for k in (*KINDS, *DETAILS)),
                             " ".join(map(str, a["runs_done_s"]))))
            for arm, a in s.get("cold", {}).items():
                cold.append((f"{scheme} {size} {arm}", _f(a["done_s"]), _f(a["exit_s"]), f"{_f(a['vs_plain'])}x",
                             f"{_f(a['exit_vs_plain'])}x", str(a["misses_max"]), _f(a["requests"]["put"], "g"),
                             _f(a["requests"]["total"], "g")))
    if len(rows) > 1:
        print()
        print_rows(rows)
    if len(cold) > 1:
        print()
        print_rows(cold)
    fl = [("fleet (moto, throttled)", "nodes", "rate/s", "ready p50", "ready p99", "seeded p50", "seeded p99",
           "exit p99", "hits", "misses", "failed", "pack", *KINDS, "total", "throttled")]
    for size, s in fig["stores"].get("s3", {}).get("sizes", {}).items():
        for arm, a in s.get("fleet", {}).items():
            fl.append((f"{size} {arm}", str(a["nodes"]), _f(a["rate_per_s"], "g"), _f(a["ready_p50_s"]),
                       _f(a["ready_p99_s"]), _f(a["seeded_p50_s"]), _f(a["seeded_p99_s"]), _f(a["exit_p99_s"]),
                       str(a["hits"]), str(a["misses"]), str(a["failed"]),
                       ", ".join(f"{v} {k}" for k, v in a["pack"].items()) or "-",
                       *(_f(a["requests"][k], "g") for k in (*KINDS, "total", "throttled"))))
    if len(fl) > 1:
        print("\nfleet: seconds from the signal (imports done); requests of the whole fleet to the last exit, "
              "medians of the rounds; pack: the nodes' starts by what they did with it, over the rounds")
        print_rows(fl)
    if fig["paper"]:
        pr = [("on paper", "rates", "counted on", "reads/node", "writes/node",
               *(f"{n:,} nodes s" for n in fleet_paper.NODES))]
        for row in fig["paper"]:
            pr.append((f"{row['size']} {row['scenario']}", row["store"], row["counted_on"],
                       _f(row["reads_per_node"], "g"),
                       _f(row["writes_per_node"], "g"),
                       *(_f(row["nodes"][str(n)]["seconds"], ".1f") for n in fleet_paper.NODES)))
        print("\non paper: seconds of the bucket's request budget a fleet start takes (reads and writes apart, the "
              "longer; a fleet node's requests those served, the throttle's 503s left out); "
              + "; ".join(f"{r.store} {r.read_per_s:g} reads/s, {r.write_per_s:g} writes/s" for r in fleet_paper.RATES))
        print_rows(pr)
    ft = [("store stops answering", "runs", "done s", "exit s", f"lost s (target <= {_LOSS_TARGET_S:g})", "killed",
           "failed", "programs done", "hits", "misses")]
    bound = ""
    for scheme, st in fig["stores"].items():
        faults = st.get("faults") or {}
        bound = f"; a job killed at {faults.get('timeout_s', 0):g} s (lost: at least)"
        for row in faults.get("rows", []):
            met = "" if row["met"] is None else " met" if row["met"] else " NOT met"
            ft.append((f"{scheme} {row['node']}, {row['fault']}", str(row["runs"]), _f(row["done_s"]),
                       _f(row["exit_s"]), (">= " if row["lost_at_least"] else "") + _f(row["lost_s"]) + met,
                       str(row["killed"]), str(row["failed"]), " ".join(map(str, row["programs_done"])),
                       " ".join(map(str, row["hits"])), " ".join(map(str, row["misses"]))))
    if len(ft) > 1:
        print("\na store that stops answering (the tier arm, to the job's exit; each job reaches the emulator "
              f"directly{bound})")
        print_rows(ft)
    for scheme, st in fig["stores"].items():
        for size, s in st["sizes"].items():
            f = s["fill"]
            pack = s["seed"]["pack"]
            print(f"{scheme} {size}: {f['filler_written']} filler written in {f['filler_s']:.0f} s; "
                  f"{s['seed']['other_records']} other jobs' records in {s['seed']['other_records_s']:.0f} s; "
                  f"pack {pack['name']!r} ({pack['keys']} entries, {pack['size_bytes']} bytes) published in "
                  f"{pack['publish_s']:.1f} s")


def _sizes(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(int(float(part[:-1]) * 1000) if part.endswith("k") else int(part))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/fleet_start.py", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_sizes, help="entries in the root, comma-separated, each size a root of its"
                        " own (default 1k,20k,100k; --quick: 1k)")
    parser.add_argument("--stores", type=lambda t: t.split(","), default=["s3", "gs", "az"],
                        help="comma-separated, of s3 (moto), gs (fake-gcs-server), az (Azurite) (default all)")
    parser.add_argument("--repeats", type=int, help="rounds of each arm; medians are reported (default 3; "
                        "--quick: 1)")
    parser.add_argument("--parts", type=lambda t: t.split(","), default=["warm", "cold", "fleet", "faults"],
                        help="what to run, comma-separated (default warm,cold,fleet,faults)")
    parser.add_argument("--quick", action="store_true", help="a check that the harness runs, not figures: one "
                        "round, a fleet of 4, one round of faults with a 120 s bound, 1k entries (unless --sizes)")
    parser.add_argument("--fleet-nodes", type=int, help="node processes in the fleet (default 32; --quick: 4)")
    parser.add_argument("--fleet-rate", type=float,
                        help="requests a second the fleet's proxy lets through, 503 SlowDown past it (default: S3's "
                             "5,500 a prefix shared by 10,000 nodes, scaled to the fleet: 17.6 for 32 nodes)")
    parser.add_argument("--fleet-sizes", type=_sizes, help="the sizes the fleet runs at (default every size)")
    parser.add_argument("--fleet-timeout-s", type=float, default=1800.0, help="a fleet node killed past this")
    parser.add_argument("--fleet-deadline-s", type=float, default=300.0,
                        help="the fleet nodes' JAXCACHE_LOOKUP_DEADLINE_S (default 300): 32 nodes on 2 cores each get "
                        "a 16th of a core, and under the default 10 s they took their slow answers for a silent store "
                        "and compiled 158 of 160 programs")
    parser.add_argument("--fault-repeats", type=int, help="rounds of the store-stops arms (default --repeats)")
    parser.add_argument("--fault-timeout-s", type=float, help="a job on a stopped store is killed past this, and "
                        "that case not run again (default 180: six times the target; --quick: 120)")
    parser.add_argument("--fault-stores", type=lambda t: t.split(","),
                        help="the stores the store-stops arms run on (default every one of --stores)")
    parser.add_argument("--record-days", type=int, default=14, help="days of other jobs' records (default 14)")
    parser.add_argument("--records-per-day", type=int, default=20, help="other jobs' records a day (default 20)")
    parser.add_argument("--fill-workers", type=int, default=32, help="uploads in flight while filling (default 32)")
    parser.add_argument("--code", metavar="DIR", help="import the jobs' jaxcache from this checkout (e.g. `git "
                        "archive HEAD core client warmup | tar -x -C DIR`) rather than the installed one")
    parser.add_argument("--request-log", action="store_true",
                        help="keep every start's requests (method, path, status) in the JSON file")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    parser.add_argument("--out", default=os.path.join(_HERE, "out", "fleet_start.json"),
                        help="the figures and every run as JSON (default bench/out/fleet_start.json)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or ([1000] if args.quick else [1000, 20000, 100000])
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.fleet_nodes = args.fleet_nodes or (4 if args.quick else 32)
    args.fault_repeats = args.fault_repeats or (1 if args.quick else args.repeats)
    args.fault_timeout_s = args.fault_timeout_s or (120.0 if args.quick else 180.0)
    args.fault_stores = args.fault_stores or args.stores
    args.fleet_sizes = args.fleet_sizes or args.sizes
    args.fleet_rate = args.fleet_rate or _S3_READS_PER_S * args.fleet_nodes / _PAPER_FLEET
    if unknown := [s for s in args.stores if s not in STARTERS]:
        parser.error(f"--stores: unknown {', '.join(unknown)}; use s3, gs, az")
    if unknown := [p for p in args.parts if p not in ("warm", "cold", "fleet", "faults")]:
        parser.error(f"--parts: unknown {', '.join(unknown)}")
    if len(set(args.sizes)) != len(args.sizes) or min(args.sizes) < 2 * _PROGRAMS:
        parser.error("--sizes: distinct sizes, each at least 10")
    if min(args.repeats, args.fleet_nodes, args.fault_repeats) < 1 or args.fleet_rate <= 0:
        parser.error("--repeats, --fleet-nodes and --fault-repeats must be >= 1, --fleet-rate > 0")
    work = Path(tempfile.mkdtemp(prefix="jaxcache-bench-fleet-"))
    version = _source_version() if args.code is None else f"{args.code} (--code)"
    began = time.perf_counter()
    all_runs: list[dict] = []
    stores: dict[str, dict] = {}

    def figures() -> dict:
        return {"version": version, "code_changed": args.code is None and _client_changed(version, _source_version()),
                "programs": _PROGRAMS, "repeats": args.repeats, "sizes": args.sizes, "fleet_rate": args.fleet_rate,
                "elapsed_s": time.perf_counter() - began, "stores": stores, "paper": paper(stores),
                "rates": [vars(r) for r in fleet_paper.RATES], "runs": all_runs}

    try:
        for scheme in args.stores:
            stores[scheme] = run_store(scheme, args, work, all_runs)
            # Each store's figures kept as soon as they are measured: a run of hours stopped later keeps them.
            save(figures(), args.out)
    finally:
        print(f"finished in {time.perf_counter() - began:.0f}s", file=sys.stderr)
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    fig = figures()
    emit(fig, args.out, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
