"""One warm-up: configure JAX for the target topology through the client, run the user's code, record coverage."""

from __future__ import annotations

import logging
import secrets
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

import msgspec

from jaxcache import packs, working_set_index
from jaxcache.coverage import NOT_WRITTEN, PRESENT, WRITTEN, ProgramCoverage, Status, WarmupRecord
from jaxcache.entry import cache_name
from jaxcache.errors import JaxcacheError
from jaxcache.records import HIT, WARMUP, WRITE, KeyUsage, RunKind, machine_of
from jaxcache.storage import Storage, open_storage
from jaxcache.topology import TpuSlice
from jaxcache.units import plural
from jaxcache.warmup import devices as dev
from jaxcache.warmup import target as tgt
from jaxcache.warmup import tpu
from jaxcache.warmup.context import WarmupContext
from jaxcache.working_set import WorkingSet

log = logging.getLogger("jaxcache.warmup")


class _Thresholds(TypedDict):
    min_compile_time_secs: float
    min_entry_size_bytes: int


# Every program is stored, however fast or small: a warm-up that skips the quick ones leaves jobs compiling.
STORE_EVERYTHING: _Thresholds = {"min_compile_time_secs": 0.0, "min_entry_size_bytes": -1}
# --check looks every program up and stores none: JAX writes no entry smaller than this.
STORE_NOTHING: _Thresholds = {"min_compile_time_secs": 0.0, "min_entry_size_bytes": 2**62}


class NothingCompiledError(JaxcacheError):
    """The warm-up put nothing in the cache; the message says why (no jit calls, thresholds)."""


@dataclass(frozen=True)
class WarmupConfig:
    """Everything a warm-up needs, already validated."""

    plan: dev.BackendPlan
    cache_dir: str
    job: str
    target: tgt.Target
    trust: str = "strict"
    flags: tpu.TargetFlags | None = None  # TPU: the target job's flags (None: this machine's own)
    chips_per_host_default: bool = True  # TPU: the host bounds are the standard ones, not --chips-per-host


def status_of(usage: KeyUsage) -> Status:
    """A run record's event as coverage: written, present (a hit), or not written."""
    if usage.event == WRITE:
        return WRITTEN
    if usage.event == HIT:
        return PRESENT
    return NOT_WRITTEN


def run_warmup(
    config: WarmupConfig,
    on_program: Callable[[KeyUsage], None] | None = None,
    *,
    write_coverage: bool = True,
    kind: RunKind = WARMUP,
    check: bool = False,
) -> WarmupRecord:
    """Fill the cache: mock the topology, enable the cache like a job would, run the target, collect coverage.

    ``kind`` goes into the run record (``warmup-verify`` for --verify's fresh process), which keeps the run out of
    jobs' figures. ``check``: look every program up and write nothing (no entry, no record). Raises
    :class:`jaxcache.warmup.target.UserCodeError` when the user's code fails; the coverage of what did compile is
    still written (it is in the cache either way).
    """
    # JAX loads with the client, here and not at import: the command refuses bad input before it, in a fraction of
    # the seconds JAX takes to load.
    from jaxcache.client import CacheAlreadyInitializedError, enable_cache

    started = time.time()
    if config.flags is not None:
        config.flags.apply()  # before libtpu starts: it reads LIBTPU_INIT_ARGS once
    dev.configure_backend(config.plan)
    # Import the entrypoint before anything touches the cache, so a typo or a broken import writes nothing.
    function = tgt.load(config.target)
    try:
        # No node-local tier: a warm-up fills the shared root itself, and its coverage says "written" only of
        # entries that are there when it returns, not of uploads still on their way.
        session = enable_cache(config.cache_dir, job=config.job, trust=config.trust, local_dir="off",
                               **(STORE_NOTHING if check else STORE_EVERYTHING))
    except CacheAlreadyInitializedError:
        raise CacheAlreadyInitializedError(
            f"importing {config.target.label} compiled something before the warm-up could set up the cache:"
            " move compiles (jit calls, array operations) from module level into the entrypoint function"
        ) from None
    session.topology = str(config.plan.topology)
    session.kind = kind
    session.write_records = not check
    # A --script is a training script: it calls enable_cache() itself, with a job's settings, and gets this session.
    session.claim_process("the warm-up")
    slice_ = config.plan.topology if isinstance(config.plan.topology, TpuSlice) else None
    storage = open_storage(config.cache_dir, must_exist=False)
    compile_only = slice_ is not None and not config.plan.attached
    if on_program is not None:
        shown = on_program
        if compile_only:
            def shown(usage: KeyUsage) -> None:
                if _compile_only_status(usage, storage) == PRESENT and usage.event != HIT:
                    usage = msgspec.structs.replace(usage, event=HIT, reason=None)
                on_program(usage)
        session.on_program(shown)
    devices = None
    if slice_ is not None:
        devices = tpu.slice_devices(slice_, config.plan.attached)
        print("what enters every key besides the program:")
        print("\n".join(tpu.key_inputs(slice_, config.flags or tpu.from_environment(), session.compression,
                                       config.chips_per_host_default)), flush=True)
    context = WarmupContext(config.plan.topology, config.plan.platform, config.plan.gpu_model, devices)
    failure: tgt.UserCodeError | None = None
    # JAX hashes every argument of this process that starts with --xla into the key; the warm-up's own arguments
    # are not the job's. A script runs with its own.
    saved_argv = sys.argv
    sys.argv = sys.argv[:1]
    try:
        with warnings.catch_warnings():
            if slice_ is not None and not config.plan.attached:
                # An entry that is there cannot be loaded without a chip: JAX warns and compiles (counted as present).
                warnings.filterwarnings("ignore", message="Error reading persistent compilation cache entry")
            tgt.run(config.target, function, context)
    except tgt.UserCodeError as exc:
        failure = exc
    finally:
        sys.argv = saved_argv
    session.wait_for_attestations()
    record = session.flush()
    if record.keys and failure is None:
        dev.check_started_backend(config.plan)
    fingerprint = record.fingerprint
    if slice_ is not None and devices:
        # This process's backend is its CPU; the keys are the slice's.
        fingerprint = msgspec.structs.replace(
            fingerprint, backend="tpu", device_kind=devices[0].device_kind, device_count=slice_.global_devices,
            local_device_count=slice_.devices, process_count=slice_.processes,
            platform_version=str(getattr(getattr(devices[0], "client", None), "platform_version", "")) or None)
    programs = tuple(
        ProgramCoverage(
            key=u.key, function=u.function, status=_compile_only_status(u, storage) if compile_only else status_of(u),
            compile_s=u.compile_s, size_bytes=u.size_bytes,
            reason=None if compile_only and u.event not in (WRITE, HIT) and storage.exists(cache_name(u.key))
            else u.reason,
            sha256=u.sha256 if u.event == WRITE else None, parts=u.parts, program=u.program,
        )
        for u in record.keys
    )
    result = WarmupRecord(
        id=_new_id(),
        job=config.job,
        topology=str(config.plan.topology),
        platform=config.plan.platform,
        gpu_model=config.plan.gpu_model,
        started_at=started,
        finished_at=time.time(),
        fingerprint=fingerprint,
        cache_dir=config.cache_dir,
        programs=programs,
    )
    if programs and write_coverage and not check:
        storage.write_atomic(result.name, result.to_json())
        try:  # the job's index, which its starts read in one request: the warmed programs are in its working set
            working_set_index.add_warmup(storage, result, machine_of(record.fingerprint, record.cpus))
        except Exception as exc:  # noqa: BLE001 - the coverage is written; the job's starts just do not prefetch it
            log.warning("warmup: could not add this warm-up to job %s's working-set index %s (%s): its starts without"
                        " a service do not prefetch these programs", config.job, config.cache_dir, exc)
    if failure is not None:
        raise failure
    return result


def publish_pack(config: WarmupConfig, record: WarmupRecord, name: str) -> packs.Published:
    """Publish the programs the warm-up stored or found in the root as the pack ``name`` (:mod:`jaxcache.packs`):
    its coverage is exactly the release's working set, with the digests of what it wrote."""
    there = [p for p in record.programs if p.status != NOT_WRITTEN]
    working = WorkingSet(job=record.job, keys=[p.key for p in there],
                         sha256={p.key: p.sha256 for p in there if p.sha256 is not None},
                         fingerprint=record.fingerprint, warmups=[record.id])
    return packs.publish_set(open_storage(config.cache_dir, must_exist=False), working, name)


def _compile_only_status(usage: KeyUsage, storage: Storage) -> Status:
    """On compile-only TPU devices JAX cannot load an entry (no chip to load it on): it compiles again and leaves
    the entry be. A key whose entry is there is as good as a hit."""
    status = status_of(usage)
    return PRESENT if status == NOT_WRITTEN and storage.exists(cache_name(usage.key)) else status


def explain_nothing_compiled(record: WarmupRecord, *, unrecognised: int = 0) -> str | None:
    """Why a warm-up that stored nothing new is a failure, or None when it stored something or found every program
    in the cache already (:func:`already_warm` says so). ``unrecognised``: lookups JAX made whose keys the client
    could not tell (see CacheStats.unrecognised)."""
    programs = record.programs
    if not programs and unrecognised:
        return (
            f"JAX {record.fingerprint.jax} looked up {unrecognised} program(s) in the cache, but jaxcache could not"
            " tell which: this JAX logs its cache records in a way jaxcache does not read (docs/jax-internals.md)."
            " The programs may well be cached (jaxcache ls shows what is); the coverage record is empty"
        )
    if not programs:
        return (
            "no jit calls: the target compiled nothing. An entrypoint must compile the job's programs, e.g."
            " jax.jit(step).lower(*abstract_inputs).compile(), or ctx.compile(step, ...)"
        )
    written = sum(p.status == WRITTEN for p in programs)
    present = sum(p.status == PRESENT for p in programs)
    if written or present == len(programs):
        return None
    reasons = sorted({p.reason for p in programs if p.status == NOT_WRITTEN and p.reason})
    return (
        f"thresholds: JAX compiled {plural(len(programs) - present, 'program')} but stored none"
        + (f" ({'; '.join(reasons)})" if reasons else "")
    )


def already_warm(record: WarmupRecord) -> str | None:
    """What to say of a warm-up that found every program it compiled in the cache already (a scheduled re-run, a
    Job's retry): the cache holds them, a success; None otherwise."""
    present = len(record.programs)
    if not present or any(p.status != PRESENT for p in record.programs):
        return None
    every = "the 1 program was" if present == 1 else f"all {present} programs were"
    return f"already warm: {every} in the cache before this run; nothing to write"


def _new_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)

