"""``warmup`` (also ``jaxcache warmup``): pre-fill a shared cache for a cluster topology from one machine."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from jaxcache import packs
from jaxcache.cli.output import as_argument
from jaxcache.cli.parser import ArgumentParser
from jaxcache.coverage import NOT_WRITTEN, PRESENT, WRITTEN, WarmupRecord
from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.numbers import parse_float, parse_int
from jaxcache.reach import reach
from jaxcache.records import WARMUP_VERIFY, KeyUsage
from jaxcache.storage import Storage, is_object_store, open_storage
from jaxcache.table import render
from jaxcache.topology import TpuSlice, parse_topology, parse_tpu_slice
from jaxcache.units import format_bytes, plural
from jaxcache.warmup import devices as dev
from jaxcache.warmup import pool, targets, tpu
from jaxcache.warmup import target as tgt
from jaxcache.warmup.check import BundleRoot, bundle_root, check_summary, check_text
from jaxcache.warmup.runner import (
    WarmupConfig,
    already_warm,
    explain_nothing_compiled,
    publish_pack,
    run_warmup,
)
from jaxcache.warmup.verify import VERIFY_TIMEOUT_S, verify

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_DESCRIPTION = """\
Compile a job's programs ahead of time for a cluster topology this machine is not, and store them in the
shared JAX cache, so the job's first step loads instead of compiling.

TOPOLOGY is SLICESxHOSTSxDEVICES: S x H processes with D devices each (4x8x1: 32 single-GPU processes).
GPU (default when JAX sees GPUs): this machine must have exactly D GPUs of the training nodes' model, since
entries only serve nodes with the same GPU model and count; JAX mocks the S x H processes
(jax_mock_gpu_topology). CPU: only 1x1xD (JAX hashes per-process CPU device ids into keys, so multi-process
CPU jobs never hit pre-filled entries); D becomes jax_num_cpu_devices.

TPU: TOPOLOGY is a slice as JAX names it (v5e:2x2, v5e:4x8, v5p:2x2x2, v6e:4x4), compiled on any x86-64
Linux machine with libtpu and no chip (below: how to install it). The chips per host enter the key: the
default is Cloud TPU's standard shape (1x1 for a single chip, else 2x2 a host), --chips-per-host overrides.
The target job's flags enter the key too: give them (--libtpu-init-args, --target-xla-flags) or take them
from the job's run records (--flags-from-job). The entrypoint's ctx.devices() are the slice's chips; a
--script is refused (its jax.devices() would be this host's CPUs). A multi-slice job, N slices joined over
the data-centre network, is Nxv5e:16x16 (or --num-slices N beside one --topology).

{libtpu}

Several targets (--topology repeated, or --targets FILE, one a line) are each compiled in a process of their
own, --parallel N at a time, and summed up in one table; every target is checked before any starts.

The cache is configured through jaxcache.client exactly as jobs configure it (same key hygiene), with
thresholds that store every program. A coverage record goes to <cache>/.jaxcache/warmups/<id>.json; the run
records say they are a warm-up's, so the service and `jaxcache prune` keep them out of jobs' hit rates."""

_EPILOG = """\
examples:
  warmup --topology 4x8x1 --cache-dir gs://bucket/jax-cache --entrypoint myjob.warm:programs --verify
  warmup --topology 1x1x4 --platform cpu --cache-dir /mnt/cache --entrypoint jaxcache.warmup.examples:warm
  warmup --topology 1x1x8 --cache-dir /mnt/cache --script train.py -- --steps 1
  warmup --platform tpu --topology v5e:4x8 --cache-dir gs://bucket/jax-cache --entrypoint myjob.warm:programs \
      --flags-from-job pretrain
  warmup --topology v5e:2x4 --topology v5e:16x16 --topology 2xv5e:16x16 --cache-dir gs://bucket/jax-cache \
      --entrypoint myjob.warm:programs --flags-from-job pretrain --parallel 2
  warmup --targets release-targets.txt --index "$JOB_COMPLETION_INDEX" --cache-dir gs://bucket/jax-cache \
      --entrypoint myjob.warm:programs

  warmup --topology 4x8x1 --cache-dir gs://bucket/jax-cache --entrypoint myjob.warm:programs --check
  warmup --topology 4x8x1 --cache-dir train.bundle --entrypoint myjob.warm:programs --check

exit codes: 0 the cache holds the programs, whether this run wrote them or found them there already (and
--verify passed; with --check: every program hit); 1 the target failed, compiled nothing, or stored none of the
programs it missed, --verify or --check found misses, or --verify ran past --verify-timeout; 2 bad input (nothing
written). With several targets: the worst target's."""


class _Parser(ArgumentParser):
    """The CLI's one-line errors; a flag option given its flags after a space is told to write them with '='."""

    def error(self, message: str) -> NoReturn:
        for option in ("--libtpu-init-args", "--target-xla-flags"):
            if message == f"argument {option}: expected one argument":
                message += f" (flags, written with '=': {option}='--xla_flag=value ...')"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (docs/user-guide.md, "Warm-up", explains its options)."""
    libtpu = (f"libtpu: {tpu.jax_install()}, the libtpu this JAX pins, or from a jaxcache clone\n"
              f"{tpu.CLONE_INSTALL}. The warm-up image (deploy/docker/warmup.Dockerfile) is for GPUs\n"
              "and has none: install it into the training image.")
    p = _Parser(prog="warmup", description=_DESCRIPTION.format(libtpu=libtpu), epilog=_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", action="append", metavar="SxHxD|TPU",
                   help="target cluster, e.g. 4x8x1, or a TPU slice, e.g. v5e:4x8 (implies --platform tpu), or N"
                        " slices of one, e.g. 2xv5e:16x16; repeat it for several targets")
    p.add_argument("--targets", metavar="FILE",
                   help="a file listing targets, one a line as --topology takes them (# starts a comment)")
    p.add_argument("--index", type=_index, metavar="N",
                   help="warm only the Nth target (from 0) of the list: one a pod of a Kubernetes Indexed Job")
    p.add_argument("--parallel", type=_count, metavar="N",
                   help="targets compiled at once, each in a process of its own (default: as many as this"
                        " machine's CPUs and memory allow; the output says how many and why)")
    p.add_argument("--cache-dir", required=True, metavar="URL",
                   help="cache root: a directory, gs://, s3:// or az://bucket/prefix; with --check also a bundle file"
                        " (`jaxcache bundle export`), checked and imported into a temporary directory the check then"
                        " reads")
    p.add_argument("--entrypoint", metavar="pkg.module:function",
                   help="called with a WarmupContext; compiles the job's programs without data")
    p.add_argument("--script", metavar="path.py",
                   help="a training script run as __main__ (only its compiles count; its own enable_cache() call"
                        " gets the warm-up's cache settings)")
    p.add_argument("--platform", choices=dev.PLATFORMS,
                   help="default: tpu for a slice name, gpu when JAX sees GPUs here, else cpu (with a warning: GPU"
                        " jobs never hit CPU entries)")
    p.add_argument("--chips-per-host", metavar="XxY[xZ]",
                   help="TPU: chips on each host of the slice (enters the key); default: Cloud TPU's standard shape")
    p.add_argument("--num-slices", type=_count, metavar="N",
                   help="TPU: the job runs N such slices joined over the data-centre network (multi-slice; the same"
                        " as --topology Nxv5e:16x16)")
    p.add_argument("--libtpu-init-args", metavar="FLAGS",
                   help="TPU: the job's LIBTPU_INIT_ARGS, written with '=', e.g."
                        " --libtpu-init-args='--xla_tpu_use_enhanced_launch_barrier=true'"
                        " (replaces this machine's; enters the key)")
    p.add_argument("--target-xla-flags", metavar="FLAGS",
                   help="TPU: the job's XLA_FLAGS, written with '=' (replaces this machine's; enters the key)")
    p.add_argument("--flags-from-job", metavar="JOB",
                   help="TPU: take the flags JAX hashed from JOB's newest run record in the cache (recorded with"
                        " key parts on), libtpu's to LIBTPU_INIT_ARGS, the rest to XLA_FLAGS")
    p.add_argument("--job", default="warmup", help="job name in the coverage and run records (default: warmup)")
    p.add_argument("--trust", choices=("strict", "warn", "off"), default="strict",
                   help="refuse a cache directory others can write (strict, default), warn, or skip the check")
    p.add_argument("--dry-run", action="store_true", help="check everything and print the plan; compile nothing")
    p.add_argument("--verify", action="store_true",
                   help="afterwards, compile the same programs in a fresh process: pass only if all hit; each miss"
                        " is explained part by part (warm-up run against verify run)")
    p.add_argument("--check", action="store_true",
                   help="pre-flight on a node of the target cluster: look the job's programs up in the shared cache"
                        " and write nothing (no entry, no record); print coverage and the cause of every miss"
                        " (exit 0 only when all hit)")
    p.add_argument("--verify-timeout", type=_seconds, default=VERIFY_TIMEOUT_S, metavar="SECONDS",
                   help=f"stop --verify's process after this long and fail (default {VERIFY_TIMEOUT_S:g})")
    p.add_argument("--ok-if-warm", action="store_true",
                   help="deprecated, does nothing: a cache that already holds every program is a success (exit 0)"
                        " without it; still accepted so that existing scripts and Jobs keep working")
    p.add_argument("--pack", metavar="NAME",
                   help="then publish the programs it stored or found (its coverage: the release's working set) as"
                        " the pack NAME in the root (.jaxcache/packs/NAME.tar, replaced whole), which jobs naming it"
                        " (JAXCACHE_PACK) seed their node's tier from in a few large reads; one target only, and"
                        " with --verify only once it passed")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--verify-child", help=argparse.SUPPRESS)
    # A target's own process, started by a command with several: --check on the attached chips, or compile-only.
    p.add_argument("--check-on", choices=("attached", "compile-only"), help=argparse.SUPPRESS)
    # A TPU target's process, started by a command with several: the target's flags, which the command resolved
    # (from the job's records, with where they came from) and checked once for all its TPU targets, as JSON.
    p.add_argument("--checked-flags", metavar="JSON", help=argparse.SUPPRESS)
    return p


def _seconds(text: str) -> float:
    return as_argument(parse_float, text, above=0, most=7 * 86400, unit="seconds")


def _count(text: str) -> int:
    return as_argument(parse_int, text, least=1)


def _index(text: str) -> int:
    return as_argument(parse_int, text, least=0, hint="(the Job's completion index)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    if argv[:1] == ["--verify-child"]:
        from jaxcache.warmup.verify import child_main

        return child_main(argv[1])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        texts = targets.from_args(args.topology, args.targets, args.index)
        if args.pack is not None:
            _check_pack(args, texts)
    except JaxcacheError as exc:
        print(f"warmup: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if len(texts) > 1:
        return _run_targets(parser, args, texts, script_args)
    # One target of a list (--index): its options as the list gives them, e.g. no TPU flags for a CPU target.
    args = targets.for_target(args, texts[0]) if args.targets or len(args.topology or ()) > 1 else args
    args.topology = texts[0]
    with contextlib.ExitStack() as stack:
        try:
            bundle = stack.enter_context(bundle_root(args)) if os.path.isfile(args.cache_dir) else None
            config = _validate(args, script_args)
        except tgt.UserCodeError as exc:
            return _user_failure(exc)
        except JaxcacheError as exc:
            print(f"warmup: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        _say_cpu_by_default([args], [config.plan])
        if args.dry_run:
            return _dry_run(config, args)
        if args.check:
            return _check(config, args, bundle)
        return _run(config, args)


def _check_pack(args: argparse.Namespace, texts: list[str]) -> None:
    """--pack publishes one target's programs: with several (or a list's pods, all of one name) each would replace
    the others'; --check writes nothing."""
    packs.check_name(args.pack)
    if len(texts) > 1 or args.targets:
        raise InvalidInputError("--pack publishes one target's programs: with several targets (or --targets) each"
                                " would replace the others' pack; run one warm-up a pack, each with its own name")
    if args.check:
        raise InvalidInputError("--check writes nothing: --pack is for a warm-up that stores its programs")


def _validate(args: argparse.Namespace, script_args: list[str],
              checked: tpu.TargetFlags | None = None) -> WarmupConfig:
    """Check everything about the target, what needs no JAX first (the topology, the options, the entrypoint's
    shape): the client loads JAX with the cache directory's check, seconds a typo should not wait for.
    ``checked``: TPU flags the command already resolved and checked, for another of its targets."""
    requested = dev.platform_for(args.topology, args.platform)
    if requested == "tpu":
        return _validate_tpu(args, script_args, checked)
    if (args.chips_per_host or args.libtpu_init_args or args.target_xla_flags or args.flags_from_job
            or args.checked_flags):
        raise InvalidInputError("--chips-per-host, --libtpu-init-args, --target-xla-flags and --flags-from-job are"
                                " for --platform tpu")
    if args.num_slices is not None:
        raise InvalidInputError(f"--num-slices is for TPU slices, not {args.topology}: a GPU job's slices are the S of"
                                " SxHxD")
    topology = parse_topology(args.topology)
    target = tgt.make_target(args.entrypoint, args.script, script_args)
    plan = dev.plan_backend(topology, "cpu", None) if requested == "cpu" else None
    cache_dir, _ = _open_cache(args)
    if plan is None:
        gpus = _probe_gpus()
        plan = dev.plan_backend(topology, requested or dev.default_platform(gpus), gpus)
    return WarmupConfig(plan=plan, cache_dir=cache_dir, job=args.job, target=target, trust=args.trust)


# One probe a command: several GPU targets are checked against the same GPUs.
_probe_gpus = functools.cache(dev.probe_gpus)


def _open_cache(args: argparse.Namespace) -> tuple[str, Storage]:
    """The cache directory, judged as enable_cache() will judge it, and opened. The client loads JAX: this comes
    after every check that needs none."""
    from jaxcache.client import check_cache_dir

    cache_dir = check_cache_dir(args.cache_dir, trust=args.trust)
    storage = open_storage(cache_dir, must_exist=False)
    if is_object_store(cache_dir):
        reach(storage)  # an unreachable bucket fails here, within seconds, not after an hour of compiling
    return cache_dir, storage


def _validate_tpu(args: argparse.Namespace, script_args: list[str], checked: tpu.TargetFlags | None) -> WarmupConfig:
    slice_ = parse_tpu_slice(args.topology, args.chips_per_host, args.num_slices)
    if args.script:
        raise InvalidInputError("--script cannot warm up a TPU slice: a script's jax.devices() are this host's CPUs,"
                                " not the slice's chips; give an --entrypoint, which gets them from ctx.devices()")
    target = tgt.make_target(args.entrypoint, args.script, script_args)
    explicit = tpu.explicit_flags(args.target_xla_flags, args.libtpu_init_args)
    if explicit is not None and args.flags_from_job:
        raise InvalidInputError("give the target's flags either explicitly or with --flags-from-job, not both")
    if checked is None and args.checked_flags is not None:
        if explicit is not None or args.flags_from_job:
            raise InvalidInputError("--checked-flags is the flags a command hands a target's process, given alone")
        checked = tpu.TargetFlags.from_json(args.checked_flags)
    cache_dir, storage = _open_cache(args)
    # A record's flags are judged before libtpu is needed: the record decides no place to read or write, here or not.
    flags = checked if checked is not None else (
        tpu.flags_from_job(storage, args.flags_from_job) if args.flags_from_job else explicit)
    # --check on a node of the slice looks up with its own chips; elsewhere libtpu describes them. A command with
    # several targets has found which one the chips are (--check-on). One slice's host does not see a multi-slice
    # job's devices: that job is checked against compile-only ones.
    on_chips = tpu.chips_here() if args.check_on is None else args.check_on == "attached"
    attached = bool(args.check) and on_chips and slice_.num_slices == 1
    plan = dev.plan_backend(slice_, "tpu", None, attached=attached)
    if flags is not None and checked is None:  # else resolved and checked once for the command's TPU targets
        tpu.check_flags(flags, slice_)  # a flag XLA or libtpu would stop on: one line, not a crash
    return WarmupConfig(plan=plan, cache_dir=cache_dir, job=args.job, target=target, trust=args.trust, flags=flags,
                        chips_per_host_default=slice_.chips_per_host == slice_.standard_hosts)


def _say_cpu_by_default(ones: Sequence[argparse.Namespace], plans: Sequence[dev.BackendPlan]) -> None:
    """One warning line for the SxHxD targets compiled for the CPU only because this machine has no GPU (no
    --platform given): entries a GPU job never hits."""
    named = [str(p.topology) for one, p in zip(ones, plans, strict=True)
             if one.platform is None and p.platform == "cpu"]
    if named:
        print(f"warmup: warning: no GPU here: compiling {', '.join(named)} for the CPU, which GPU jobs never hit; pass"
              " --platform cpu to say that is meant, or run on a node with the target's GPUs", file=sys.stderr,
              flush=True)


def _check(config: WarmupConfig, args: argparse.Namespace, bundle: BundleRoot | None) -> int:
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    try:
        with quiet, _client_notices():
            record = run_warmup(config, write_coverage=False, kind=WARMUP_VERIFY, check=True)
    except tgt.UserCodeError as exc:
        return _user_failure(exc)
    except JaxcacheError as exc:
        print(f"warmup: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    summary = check_summary(config, record)
    if bundle is not None:
        summary.update(cache_dir=bundle.path, bundle=bundle.imported.to_json())
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(check_text(summary) if bundle is None else f"{bundle.text()}\n{check_text(summary)}")
    return EXIT_OK if summary["programs"] and summary["hits"] == summary["programs"] else EXIT_FAILED


def _dry_run(config: WarmupConfig, args: argparse.Namespace) -> int:
    dev.configure_backend(config.plan)  # config values only: the backend stays unstarted
    try:
        tgt.load(config.target)
    except tgt.UserCodeError as exc:
        return _user_failure(exc)
    except JaxcacheError as exc:
        print(f"warmup: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    plan = {
        "topology": str(config.plan.topology), "processes": config.plan.topology.processes,
        "devices_per_process": config.plan.topology.devices, "platform": config.plan.platform,
        "gpu_model": config.plan.gpu_model, "cache_dir": config.cache_dir, "job": config.job,
        "target": config.target.label, "jax_settings": config.plan.jax_settings(), "dry_run": True,
    }
    if isinstance(config.plan.topology, TpuSlice):
        slice_ = config.plan.topology
        flags = config.flags or tpu.from_environment()
        plan.update(chips=slice_.chips, slices=slice_.num_slices, global_devices=slice_.global_devices,
                    chips_per_host="x".join(map(str, slice_.chips_per_host)),
                    chips_per_host_default=config.chips_per_host_default, libtpu=tpu.libtpu_version(),
                    flags=list(flags.all), xla_flags=list(flags.xla_flags),
                    libtpu_init_args=list(flags.libtpu_init_args), flags_from=flags.source,
                    flags_not_taken=list(flags.left_out),
                    # where the target's flags were tried (none given: this machine's, nothing to try)
                    flags_checked=None if config.flags is None else "by the command" if args.checked_flags else "here",
                    attached=config.plan.attached)
    if args.json:
        print(json.dumps(plan, sort_keys=True))
    else:
        print("warmup plan (dry run: nothing compiled, nothing written)")
        for name, value in plan.items():
            if name != "dry_run":
                print(f"  {name:20} {value}")
    return EXIT_OK


def _run(config: WarmupConfig, args: argparse.Namespace) -> int:
    show = _ProgramPrinter(stream=sys.stderr if args.json else sys.stdout)
    # With --json, stdout carries only the summary: what the user's code prints goes to stderr.
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    try:
        with quiet, _client_notices():
            record = run_warmup(config, on_program=show)
    except tgt.UserCodeError as exc:
        show.close()
        return _user_failure(exc)
    except JaxcacheError as exc:
        show.close()
        print(f"warmup: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    show.close()
    from jaxcache.client import current_session  # loaded by the warm-up already

    summary = _summary(record)
    session = current_session()
    why = explain_nothing_compiled(record, unrecognised=session.stats().unrecognised if session else 0)
    warm = already_warm(record)  # a success: the cache holds every program (a scheduled re-run, a Job's retry)
    verdict = None
    if args.verify and why is None:
        verdict = verify(config, record, timeout_s=args.verify_timeout)
        summary["verify"] = verdict.as_dict()
    published = None
    if args.pack is not None and why is None and (verdict is None or verdict.ok):
        try:
            published = publish_pack(config, record, args.pack)
        except JaxcacheError as exc:
            print(f"warmup: error: could not publish the pack {args.pack!r}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        summary["pack"] = _pack_summary(published)
    if args.json:
        print(json.dumps(summary, sort_keys=True))  # already_warm == programs says it
    else:
        print(_summary_table(summary) + (f"\n{warm}" if warm is not None else ""))
        if verdict is not None:
            print(verdict.explain())
        if published is not None:
            print(_pack_text(published, config.cache_dir))
    if published is not None and published.info is None:
        print(f"warmup: error: pack {args.pack!r} not published: none of its programs could be exported",
              file=sys.stderr)
        return EXIT_FAILED
    if why is not None:
        print(f"warmup: error: nothing stored: {why}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FAILED if verdict is not None and not verdict.ok else EXIT_OK


def _run_targets(parser: argparse.ArgumentParser, args: argparse.Namespace, texts: list[str],
                 script_args: list[str]) -> int:
    """Several targets: every one checked here before any starts, then each warmed (or checked, or planned) in a
    process of its own, --parallel at a time, and one table. The exit code is the worst target's."""
    if args.num_slices is not None or args.chips_per_host:
        print("warmup: error: with several targets, write each one whole (2xv5e:16x16 for N slices, v5e:2x4@2x4x1"
              " for its chips per host), not --num-slices or --chips-per-host", file=sys.stderr)
        return EXIT_USAGE
    out = sys.stderr if args.json else sys.stdout
    with contextlib.ExitStack() as stack:
        try:
            bundle = stack.enter_context(bundle_root(args)) if os.path.isfile(args.cache_dir) else None
            ones = [targets.for_target(args, text) for text in texts]
            # The TPU targets share the command's flags: the first resolves them (reading the job's records) and
            # checks them, the others and every target's process take them as they are.
            flags: tpu.TargetFlags | None = None
            plans = []
            for one in ones:
                config = _validate(one, script_args, flags)
                plans.append(config.plan)
                flags = flags or config.flags
        except JaxcacheError as exc:
            print(f"warmup: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        _say_cpu_by_default(ones, plans)
        on = _chips_for_check(args, plans, out)
        handed = flags.to_json() if flags is not None else None
        jobs = [pool.Job(str(plan.topology), plan.platform,
                         targets.child_argv(parser, one, platform=plan.platform, script_args=script_args,
                                            check_on=on.get(str(plan.topology)),
                                            checked_flags=handed if plan.platform == "tpu" else None))
                for one, plan in zip(ones, plans, strict=True)]
        if args.parallel:
            parallel, why = args.parallel, f"--parallel {args.parallel}"
        else:
            parallel, why = pool.default_parallel(len(jobs))
            why = f"the default here: {why}; --parallel N sets it"
        print(f"warmup: {len(jobs)} targets, {min(parallel, len(jobs))} at a time ({why})", file=out, flush=True)
        show = _TargetPrinter(len(jobs), out)
        try:
            done = pool.run_all(jobs, parallel, show)
        except KeyboardInterrupt:
            show.close()
            print("warmup: interrupted: the targets' processes were stopped", file=sys.stderr)
            return 130
        show.close()
        worst = max(_exit_of(d) for d in done)
        if args.json:
            print(json.dumps({"targets": [_target_json(d, on) for d in done], "parallel": parallel,
                              "parallel_why": why, "exit": worst}, sort_keys=True))
            return worst
        if bundle is not None:
            print(bundle.text())
        print(_targets_table(done, args, on))
        for d in done:
            details = _target_details(d)
            if details:
                print(f"\n---- {d.job.target} ----\n{details}")
        return worst


def _chips_for_check(args: argparse.Namespace, plans: list[dev.BackendPlan], out: Any) -> dict[str, str]:
    """--check on a node with chips: which TPU target they are (that one is checked on them, the others against
    compile-only devices), by what JAX sees of them. Elsewhere: nothing to decide."""
    slices = [p.topology for p in plans if isinstance(p.topology, TpuSlice)]
    if not args.check or not slices or not tpu.chips_here():
        return {}
    chips = tpu.probe_attached()
    match = tpu.attached_slice(slices, chips)
    print(f"warmup: this host's chips: {chips}; " + (
        f"{match} is checked on them, the other targets against compile-only devices" if match else
        "no target is them: every target is checked against compile-only devices"), file=out, flush=True)
    return {str(s): "attached" if s == match else "compile-only" for s in slices}


def _exit_of(done: pool.Done) -> int:
    """A target's exit code; a process stopped by a signal failed."""
    return done.exit_code if done.exit_code in (EXIT_OK, EXIT_FAILED, EXIT_USAGE) else EXIT_FAILED


def _target_json(done: pool.Done, on: dict[str, str]) -> dict[str, Any]:
    errors = [line for line in done.stderr.splitlines() if line.startswith("warmup: ")]
    return {"target": done.job.target, "platform": done.job.platform, "exit": _exit_of(done), "wall_s": done.wall_s,
            "peak_rss_bytes": done.peak_rss_bytes, "cpu_s": done.cpu_s, "summary": done.summary, "errors": errors,
            "checked_on": on.get(done.job.target)}


_RESULTS = {EXIT_OK: "ok", EXIT_FAILED: "failed", EXIT_USAGE: "bad input"}


def _result(done: pool.Done) -> str:
    """A target's result in a word or two: ok, already warm (ok, every program was there), failed, bad input."""
    code, s = _exit_of(done), done.summary or {}
    if code == EXIT_OK and s.get("programs") and s.get("already_warm") == s["programs"]:
        return "already warm"
    return _RESULTS[code]


def _targets_table(done: list[pool.Done], args: argparse.Namespace, on: dict[str, str]) -> str:
    def cell(d: pool.Done, name: str, fmt: str = "{}") -> str:
        return fmt.format(d.summary[name]) if d.summary and d.summary.get(name) is not None else "-"

    def tail(d: pool.Done) -> list[str]:
        return [f"{d.wall_s:.1f}", format_bytes(d.peak_rss_bytes), f"{_exit_of(d)} {_result(d)}"]

    if args.dry_run:
        headers = ["target", "platform", "processes", "devices a process", "global devices"]
        rows = [[d.job.target, d.job.platform, cell(d, "processes"), cell(d, "devices_per_process"),
                 str(d.summary["processes"] * d.summary["devices_per_process"]) if d.summary else "-"] + tail(d)
                for d in done]
    elif args.check:
        headers = ["target", "platform", "checked on", "programs", "hits", "coverage"]
        rows = [[d.job.target, d.job.platform, "chips" if on.get(d.job.target) == "attached" else
                 "compile-only" if d.job.platform == "tpu" else "this machine", cell(d, "programs"), cell(d, "hits"),
                 f"{100 * d.summary['coverage']:.0f}%" if d.summary and d.summary.get("coverage") is not None
                 else "-"] + tail(d) for d in done]
    else:
        headers = ["target", "platform", "programs", "written", "already warm", "not written", "compile s"]
        rows = [[d.job.target, d.job.platform, cell(d, "programs"), cell(d, "written"), cell(d, "already_warm"),
                 cell(d, "not_written"), cell(d, "compile_s", "{:.1f}")] + tail(d) for d in done]
    headers += ["wall s", "peak memory", "exit"]
    numbers = frozenset(i for i, h in enumerate(headers) if h not in ("target", "platform", "checked on", "exit"))
    table = render(headers, rows, right=numbers)
    records = [f"  {d.job.target}: {d.summary['cache_dir']}/{d.summary['coverage_record']}" for d in done
               if d.summary and d.summary.get("coverage_record")]
    return table + ("\ncoverage records:\n" + "\n".join(records) if records else "")


def _target_details(done: pool.Done) -> str | None:
    """What to say under the table about one target: its check's misses, its verify's verdict, its errors."""
    parts = []
    s = done.summary or {}
    if s.get("misses"):
        parts.append(check_text(s))
    if s.get("verify") and not s["verify"]["ok"]:
        from jaxcache.warmup.verify import VerifyResult

        parts.append(VerifyResult(**s["verify"]).explain())
    lines = done.stderr.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("warmup: ")), None)
    if first is not None:
        parts.append("\n".join(lines[first:]))
    return "\n".join(parts) or None


class _TargetPrinter:
    """One line per target as its process finishes, plus a live counter on a terminal."""

    def __init__(self, total: int, stream: Any) -> None:
        self._lines = _Lines("targets", stream, total)
        self._total = total

    def __call__(self, done: pool.Done) -> None:
        self._lines.show(f"  [{self._lines.count + 1}/{self._total}] {done.job.target:16} {_result(done):12}"
                         f" {done.wall_s:7.1f} s  peak {format_bytes(done.peak_rss_bytes)}")

    def close(self) -> None:
        self._lines.close()


@contextlib.contextmanager
def _client_notices() -> Iterator[None]:
    """Show the client's notices on stderr while the warm-up runs (from INFO: that a --script's own enable_cache()
    got the warm-up's settings is one): nothing else in this process configures logging, and Python's fallback
    shows warnings only."""
    logger = logging.getLogger("jaxcache.client")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.INFO)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # a script that configured logging itself would show each notice twice
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _user_failure(exc: tgt.UserCodeError) -> int:
    print(f"warmup: error: {exc}", file=sys.stderr)
    print("---- traceback from YOUR code (not from warmup) ----", file=sys.stderr)
    print(exc.details, file=sys.stderr)
    print("---- end of your traceback ----", file=sys.stderr)
    return EXIT_FAILED


def _summary(record: WarmupRecord) -> dict[str, Any]:
    programs = record.programs
    return {
        "id": record.id,
        "topology": record.topology,
        "platform": record.platform,
        "gpu_model": record.gpu_model,
        "job": record.job,
        "cache_dir": record.cache_dir,
        "coverage_record": record.name,
        "programs": len(programs),
        "written": sum(p.status == WRITTEN for p in programs),
        "already_warm": sum(p.status == PRESENT for p in programs),
        "not_written": sum(p.status == NOT_WRITTEN for p in programs),
        "compile_s": round(sum(p.compile_s or 0.0 for p in programs if p.status != PRESENT), 3),
        "fingerprint": record.fingerprint.as_dict(),
        "keys": [{"key": p.key, "function": p.function, "status": p.status, "compile_s": p.compile_s,
                  "size_bytes": p.size_bytes, "reason": p.reason} for p in programs],
    }


def _pack_summary(published: packs.Published) -> dict[str, Any]:
    info, exported = published.info, published.exported
    return {"name": published.name, "object": None if info is None else info.name,
            "version": None if info is None else info.version, "size_bytes": exported.size_bytes,
            "entries": len(exported.manifest.entries),
            "left_out": [{"key": x.key, "why": x.why} for x in exported.left_out]}


def _pack_text(published: packs.Published, cache_dir: str) -> str:
    if published.info is None:
        return f"pack {published.name}: nothing published"
    left = published.exported.left_out
    return (f"pack {published.name}: published {plural(len(published.exported.manifest.entries), 'program')} as"
            f" {cache_dir}/{published.info.name} ({format_bytes(published.exported.size_bytes)})"
            + (f"; {len(left)} left out ({left[0].key}: {left[0].why})" if left else ""))


def _summary_table(s: dict[str, Any]) -> str:
    rows = [[s["topology"], s["platform"] + (f" ({s['gpu_model']})" if s["gpu_model"] else ""), str(s["programs"]),
             str(s["written"]), str(s["already_warm"]), str(s["not_written"]), f"{s['compile_s']:.1f}"]]
    table = render(["topology", "platform", "programs", "written", "already warm", "not written", "compile s"],
                   rows, right=frozenset({2, 3, 4, 5, 6}))
    return f"{table}\ncoverage record: {s['cache_dir']}/{s['coverage_record']}"


class _ProgramPrinter:
    """One line per program as JAX finishes it, plus a live counter on a terminal."""

    def __init__(self, stream: Any) -> None:
        self._lines = _Lines("programs", stream)

    def __call__(self, usage: KeyUsage) -> None:
        status = {"write": "written", "hit": "already present"}.get(usage.event, f"not written ({usage.reason})")
        seconds = f"{usage.compile_s:7.2f} s" if usage.compile_s is not None else "        "
        size = format_bytes(usage.size_bytes) if usage.size_bytes else ""
        self._lines.show(f"  {usage.function:40} {seconds}  {status} {size}".rstrip())

    def close(self) -> None:
        self._lines.close()


class _Lines:
    """Lines on ``stream`` as things finish, under a tqdm counter of them while stderr is a terminal."""

    def __init__(self, what: str, stream: Any, total: int | None = None) -> None:
        self._stream = stream
        self.count = 0
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=what, unit=f" {what}", file=sys.stderr, leave=False)

    def show(self, line: str) -> None:
        self.count += 1
        if self._bar is not None:
            self._bar.write(line, file=self._stream)
            self._bar.update(1)
        else:
            print(line, file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
