"""``--verify``: a fresh process configured exactly like a job compiles the same programs; all must hit.

A fresh process is the only honest check: this process's in-memory caches would answer without touching the
persistent cache, and a job never shares a process with its warm-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import msgspec

from jaxcache.coverage import WarmupRecord
from jaxcache.explain.from_root import knowns_of_warmup
from jaxcache.explain.text import blocks
from jaxcache.records import HIT, WARMUP_VERIFY, Fingerprint, KeyUsage
from jaxcache.storage import open_storage
from jaxcache.table import render
from jaxcache.units import plural
from jaxcache.warmup.misses import explained, miss_of
from jaxcache.warmup.runner import WarmupConfig

VERIFY_TIMEOUT_S = 3600.0  # --verify-timeout's default


@dataclass(frozen=True)
class VerifyResult:
    """What the fresh process saw."""

    ok: bool
    hits: int
    misses: list[dict]  # programs it compiled instead of loading: key, function, cause, differs, nearest, fix
    fingerprint: dict
    warmup_fingerprint: dict
    error: str | None = None

    def as_dict(self) -> dict:
        """For --json."""
        return asdict(self)

    def explain(self) -> str:
        """Human-readable: the misses, and both fingerprints side by side where they differ."""
        if self.ok:
            every = "the 1 program" if self.hits == 1 else f"all {self.hits} programs"
            return f"verify: ok: a fresh process loaded {every} from the cache"
        if self.error:
            return f"verify: FAILED: {self.error}"
        lines = [f"verify: FAILED: {plural(len(self.misses), 'program')} missed in a fresh process:", ""]
        lines.append(blocks(self.misses))
        rows = [
            [name, str(self.warmup_fingerprint.get(name)), str(self.fingerprint.get(name)),
             "" if self.warmup_fingerprint.get(name) == self.fingerprint.get(name) else "<- differs"]
            for name in sorted(set(self.warmup_fingerprint) | set(self.fingerprint))
        ]
        lines += ["", render(["fingerprint", "warm-up", "verify run", ""], rows)]
        return "\n".join(lines)


def verify(config: WarmupConfig, record: WarmupRecord, *, timeout_s: float = VERIFY_TIMEOUT_S) -> VerifyResult:
    """Run the target again in a fresh process with the same settings and compare; a process that runs past
    ``timeout_s`` is killed and the result fails saying so."""
    payload = json.dumps({
        "platform": config.plan.platform, "topology": str(config.plan.topology), "cache_dir": config.cache_dir,
        "job": config.job, "entrypoint": config.target.entrypoint, "script": config.target.script,
        "script_args": list(config.target.script_args), "trust": config.trust,
    })
    env = {**os.environ, "JAXCACHE_RUN_ID": f"{record.id}-verify"}
    warm_fp = record.fingerprint.as_dict()
    try:
        proc = subprocess.run([sys.executable, "-m", "jaxcache.warmup", "--verify-child", payload],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        return VerifyResult(False, 0, [], {}, warm_fp, error=_timed_out(config, timeout_s, exc.stderr))
    try:
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = proc.stderr.strip()[-2000:]
        return VerifyResult(False, 0, [], {}, warm_fp, error=f"the verify process failed (exit {proc.returncode}):"
                                                              f"\n{tail}")
    wanted = {p.key for p in record.programs}
    hits = [k for k in seen["keys"] if k["event"] == HIT]
    compiled = [k for k in seen["keys"] if k["event"] != HIT]
    fingerprint = msgspec.convert({k: v for k, v in seen["fingerprint"].items() if k != "digest"}, Fingerprint)
    # A miss is judged at the moment the child looked its key up: the child writes what it compiles, and an entry
    # it wrote itself must not read as one that was there and could not be loaded.
    misses = [miss_of(k, fingerprint, run_id=f"{record.id}-verify", job=config.job, topology=record.topology,
                      at=k.get("at")) for k in compiled]
    storage = open_storage(config.cache_dir, must_exist=False)
    found = explained(storage, misses, knowns_of_warmup(record))
    # A warm-up key that a miss already names as its nearest is that miss's other half, not a second finding.
    not_seen = wanted - {k["key"] for k in seen["keys"]} - {m["nearest"] for m in found}
    found += [{"key": key, "function": key.rsplit("-", 1)[0], "cause": "not_compiled", "differs": [],
               "nearest": None, "fix": "the fresh process did not compile this program: the target compiles"
               " something else the second time (a program chosen at random, or by time)"} for key in sorted(not_seen)]
    return VerifyResult(not found, len(hits), found, seen["fingerprint"], warm_fp)


def _timed_out(config: WarmupConfig, timeout_s: float, stderr: bytes | str | None) -> str:
    # Output so far comes back as bytes whatever text= says (the process was killed mid-write).
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
    if config.target.script:
        why = ("it runs the whole script again: give the script arguments that stop it after its first steps"
               " (warmup ... --script train.py -- --steps 1), or allow it longer with --verify-timeout SECONDS")
    else:
        why = ("it runs the entrypoint again, loading what the warm-up stored instead of compiling; allow it longer"
               " with --verify-timeout SECONDS")
    message = (f"the verify process did not finish in {timeout_s:g} s and was stopped: {why}. The programs the"
               " warm-up stored are in the cache either way")
    tail = text.strip()[-2000:]
    return f"{message}. Its last output:\n{tail}" if tail else message


def child_main(payload: str) -> int:
    """The fresh process: same backend plan and client settings, run the target, print what hit."""
    from jaxcache.topology import parse_any_topology
    from jaxcache.warmup import devices as dev
    from jaxcache.warmup import target as tgt
    from jaxcache.warmup.misses import program_dict
    from jaxcache.warmup.runner import run_warmup

    spec = json.loads(payload)
    topology = parse_any_topology(spec["topology"])
    gpus = dev.probe_gpus() if spec["platform"] == "gpu" else None
    plan = dev.plan_backend(topology, spec["platform"], gpus)
    target = tgt.Target(entrypoint=spec["entrypoint"], script=spec["script"], script_args=spec["script_args"])
    config = WarmupConfig(plan=plan, cache_dir=spec["cache_dir"], job=spec["job"], target=target,
                          trust=spec["trust"])
    looked_up: dict[str, float] = {}

    def seen(usage: KeyUsage) -> None:
        looked_up.setdefault(usage.key, usage.first_at or time.time())

    record = run_warmup(config, write_coverage=False, kind=WARMUP_VERIFY, on_program=seen)
    keys = [{**program_dict(p), "event": HIT if p.status == "present" else "compiled", "at": looked_up.get(p.key)}
            for p in record.programs]
    fp = record.fingerprint.as_dict()
    print(json.dumps({"keys": keys, "fingerprint": fp}), flush=True)
    return 0

