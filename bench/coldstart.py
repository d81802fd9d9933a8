"""Cold start of a real train step with ``jaxcache.client``: no cache, a cold cache and a warm one (time to first
step, process wall), what capturing key parts costs a cold and a warm start, the steady state with and without the
client against an A/A noise arm, and the cost of ``import jaxcache.client``. Every sample runs in a fresh
interpreter (bench/coldstart_worker.py); figures are medians and ratios within one run. What each figure means:
README.md.

    .venv/bin/python bench/coldstart.py             # table; figures also in bench/out/coldstart.json
    .venv/bin/python bench/coldstart.py --quick     # fewer runs and steps, about three minutes
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

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
from tables import emit, print_rows  # noqa: E402

_WORKER = os.path.join(_HERE, "coldstart_worker.py")
_MODES = ("nocache", "cold", "warm")
_STEADY_ARMS = ("without", "with", "without-again")
# Starts with the key-part capture on and off (JAXCACHE_KEY_PARTS); "cold-on-again" is the A/A noise arm.
_PARTS_ARMS = ("cold-on", "cold-off", "cold-on-again", "warm-on", "warm-off")
_PARTS_TARGET = 1.05
_IMPORT_TARGET_MS = 50.0
# Environment that would change what a worker does: cleared so every worker starts from the same place.
_CLEARED_ENV = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "JAX_ENABLE_COMPILATION_CACHE")


# --------------------------------------------------------------------------------------------------------------
# The parent: launches workers, never imports jax.


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV and not k.startswith("JAXCACHE_")}
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS") or "cpu"
    return env


def launch(args: list[str], timeout: float = 600, env: dict[str, str] | None = None) -> dict:
    """Run a worker; return its JSON plus ``wall_s`` (launch to exit, measured here)."""
    launched = time.time()
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, _WORKER, *args, "--launched", repr(launched)], capture_output=True,
                          text=True, env={**_env(), **(env or {})}, timeout=timeout)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"worker {' '.join(args)} failed with exit code {proc.returncode}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = wall
    return out


def entries(cache_dir: str) -> dict[str, int]:
    """The cache's entry files and their mtimes (run records under .jaxcache/ are not entries)."""
    with os.scandir(cache_dir) as it:
        return {e.name: e.stat().st_mtime_ns for e in it if e.is_file()}


def _shape_args(args: argparse.Namespace) -> list[str]:
    return ["--layers", str(args.layers), "--d-model", str(args.d_model), "--heads", str(args.heads),
            "--seq", str(args.seq), "--batch", str(args.batch), "--vocab", str(args.vocab)]


def measure(args: argparse.Namespace, work: str) -> dict:
    shape = _shape_args(args)
    warm_dir = os.path.join(work, "cache-0")
    order = list(_MODES[1:] + _MODES[:1])  # cold, warm, nocache: the first cold run fills the warm directory
    coldstart: dict[str, list[dict]] = {m: [] for m in _MODES}
    for r in range(args.repeat):
        for mode in order[r % 3:] + order[: r % 3]:  # rotated, so no mode always runs first
            cache_dir = warm_dir if mode == "warm" or (mode == "cold" and r == 0) else os.path.join(work, f"cache-{r}")
            if mode == "cold" and r and os.path.exists(cache_dir):
                raise SystemExit(f"{cache_dir} exists: a cold run needs a new directory")
            got = launch(["--mode", mode, "--cache-dir", cache_dir, "--steps", str(args.steps), *shape])
            coldstart[mode].append(got)
            print(f"  coldstart run {r + 1}/{args.repeat} {mode:8s} first step {got['first_step_s']:6.2f} s, "
                  f"wall {got['wall_s']:6.2f} s", file=sys.stderr)
    written = entries(warm_dir)

    # What capturing key parts costs a start (with its log at DEBUG JAX hashes each part of a key twice).
    parts: dict[str, list[dict]] = {arm: [] for arm in _PARTS_ARMS}
    for r in range(args.parts_repeat):
        for arm in _PARTS_ARMS[r % 5:] + _PARTS_ARMS[: r % 5]:
            mode = arm.partition("-")[0]
            cache_dir = warm_dir if mode == "warm" else os.path.join(work, f"parts-{r}-{arm}")
            got = launch(["--mode", mode, "--cache-dir", cache_dir, "--steps", "0", *shape],
                         env={"JAXCACHE_KEY_PARTS": "off" if arm.endswith("-off") else "on"})
            parts[arm].append(got)
            print(f"  key parts run {r + 1}/{args.parts_repeat} {arm:13s} first step {got['first_step_s']:6.2f} s",
                  file=sys.stderr)

    # Three arms per round, in a rotating order: without the client, with it, and without it again. The second
    # "without" is the yardstick: what two runs of the very same thing differ by on this machine right now.
    steady: dict[str, list[dict]] = {arm: [] for arm in _STEADY_ARMS}
    for r in range(args.steady_repeat):
        for arm in _STEADY_ARMS[r % 3:] + _STEADY_ARMS[: r % 3]:
            mode = "with" if arm == "with" else "without"
            got = launch(["--mode", mode, "--cache-dir", warm_dir, "--steps", str(args.steady_steps), *shape])
            if entries(warm_dir) != written:
                raise SystemExit(f"the {arm!r} steady-state process wrote to the warm cache: it missed, so it did not"
                                 " run the same compiled program (do its JAX settings match the client's?)")
            steady[arm].append(got)
            print(f"  steady run {r + 1}/{args.steady_repeat} {arm:13s} {args.steady_steps} steps "
                  f"{got['loop_s']:6.2f} s", file=sys.stderr)

    imports = [launch(["--mode", "import"]) for _ in range(args.import_repeat)]
    return {"coldstart": coldstart, "parts": parts, "steady": steady, "imports": imports, "entries": len(written),
            "entry_bytes": sum(os.path.getsize(os.path.join(warm_dir, n)) for n in written)}


def report(runs: dict, args: argparse.Namespace) -> dict:
    med = statistics.median
    cs = runs["coldstart"]
    first = {m: med(r["first_step_s"] for r in cs[m]) for m in _MODES}
    wall = {m: med(r["wall_s"] for r in cs[m]) for m in _MODES}
    losses = {round(r["first_loss"], 5) for m in _MODES for r in cs[m]}
    if len(losses) != 1:
        raise SystemExit(f"the modes disagree on the first step's loss: {sorted(losses)}")
    stats = {m: [r["stats"] for r in cs[m]] for m in ("cold", "warm")}
    odd = []
    for r in cs["cold"]:
        s = r["stats"]
        if s["hits"] or not s["misses"] or s["writes"] != s["misses"]:
            odd.append(f"a cold run's stats: {r['summary']}")

    kp = runs["parts"]
    kp_first = {arm: med(r["first_step_s"] for r in kp[arm]) for arm in kp}
    if any(r["keys_with_parts"] for arm in ("cold-off", "warm-off") for r in kp[arm]) or not all(
            r["keys_with_parts"] for arm in ("cold-on", "warm-on") for r in kp[arm]):
        odd.append("key parts: captured with JAXCACHE_KEY_PARTS=off, or not captured with it on")

    def kp_rounds(arm: str, base: str) -> list[float]:
        return [a["first_step_s"] / b["first_step_s"] for a, b in zip(kp[arm], kp[base], strict=True)]

    st = runs["steady"]
    loop = {m: med(r["loop_s"] for r in st[m]) for m in st}
    best = {m: med(r["step_s_best_chunk"] for r in st[m]) for m in st}

    def per_round(arm: str, key: str) -> list[float]:
        return [a[key] / b[key] for a, b in zip(st[arm], st["without"], strict=True)]

    loop_events = {m: sum(r["loop_events"] + r["loop_log_records"] for r in st[m]) for m in st}
    if any(loop_events.values()):
        odd.append(f"jax.monitoring events or JAX cache log records during the step loops: {loop_events}")
    if len({r["last_loss"] for m in st for r in st[m]}) != 1:
        odd.append("steady state: the processes with and without the client ended on different losses")

    imp = runs["imports"]
    foreign = sorted({p for r in imp for p in r["foreign_packages"]})
    if foreign:
        odd.append(f"import jaxcache.client pulls in packages beyond jax, zstandard and the stdlib: {foreign}")

    def ms(x: float) -> float:
        return round(1000 * x, 1)

    return {
        "shape": {k: getattr(args, k) for k in ("layers", "d_model", "heads", "seq", "batch", "vocab")},
        "repeat": args.repeat,
        "steps_after_first": args.steps,
        "entries_written": runs["entries"],
        "entry_bytes": runs["entry_bytes"],
        "first_step_s": {m: round(first[m], 3) for m in _MODES},
        "wall_s": {m: round(wall[m], 3) for m in _MODES},
        "first_step_cold_vs_warm": round(first["cold"] / first["warm"], 2),
        "first_step_nocache_vs_warm": round(first["nocache"] / first["warm"], 2),
        "first_step_cold_vs_nocache": round(first["cold"] / first["nocache"], 2),
        "wall_cold_vs_warm": round(wall["cold"] / wall["warm"], 2),
        "wall_nocache_vs_warm": round(wall["nocache"] / wall["warm"], 2),
        "enable_cache_ms": {m: ms(med(r["enable_cache_s"] for r in cs[m])) for m in ("cold", "warm")},
        "import_jax_ms": {m: ms(med(r["import_jax_s"] for r in cs[m])) for m in _MODES},
        "stats": {m: {k: med(s[k] for s in stats[m]) for k in stats[m][0] if stats[m][0][k] is not None}
                  for m in stats},
        "key_parts": {
            "repeat": args.parts_repeat,
            "first_step_s": {arm: round(kp_first[arm], 3) for arm in kp},
            "cold_on_vs_off": round(kp_first["cold-on"] / kp_first["cold-off"], 3),
            "cold_on_vs_off_per_round": [round(x, 3) for x in kp_rounds("cold-on", "cold-off")],
            "cold_on_vs_off_median_round": round(med(kp_rounds("cold-on", "cold-off")), 3),
            "cold_again_vs_on_median_round": round(med(kp_rounds("cold-on-again", "cold-on")), 3),
            "cold_again_vs_on": round(kp_first["cold-on-again"] / kp_first["cold-on"], 3),
            "warm_on_vs_off": round(kp_first["warm-on"] / kp_first["warm-off"], 3),
            "warm_on_vs_off_per_round": [round(x, 3) for x in kp_rounds("warm-on", "warm-off")],
            "warm_on_vs_off_median_round": round(med(kp_rounds("warm-on", "warm-off")), 3),
            "target": _PARTS_TARGET,
        },
        "steady": {
            "steps": args.steady_steps,
            "repeat": args.steady_repeat,
            "loop_s": {m: round(loop[m], 3) for m in loop},
            "step_ms": {m: round(1000 * loop[m] / args.steady_steps, 3) for m in loop},
            "with_vs_without": round(loop["with"] / loop["without"], 3),
            "again_vs_without": round(loop["without-again"] / loop["without"], 3),
            "with_vs_without_per_round": [round(x, 3) for x in per_round("with", "loop_s")],
            "again_vs_without_per_round": [round(x, 3) for x in per_round("without-again", "loop_s")],
            "best_chunk_step_ms": {m: round(1000 * best[m], 3) for m in best},
            "with_vs_without_best_chunk": round(best["with"] / best["without"], 3),
            "again_vs_without_best_chunk": round(best["without-again"] / best["without"], 3),
            "events_and_log_records_in_loops": loop_events,
            "first_step_s": {m: round(med(r["first_step_s"] for r in st[m]), 3) for m in st},
        },
        "imports": {
            "repeat": args.import_repeat,
            "import_jax_ms": ms(med(r["import_jax_s"] for r in imp)),
            "import_client_ms": ms(med(r["import_client_s"] for r in imp)),
            "import_client_ms_runs": [ms(r["import_client_s"]) for r in imp],
            "import_client_vs_jax": round(med(r["import_client_s"] / r["import_jax_s"] for r in imp), 3),
            "new_modules": med(r["new_modules"] for r in imp),
            "target_ms": _IMPORT_TARGET_MS,
        },
        "first_loss": cs["nocache"][0]["first_loss"],
        "odd": odd,
        "runs": runs,
    }


def print_table(fig: dict) -> None:
    rows = [("mode", "first step s", "vs warm", "process wall s", "vs warm", "enable_cache() ms", "import jax ms")]
    for m in _MODES:
        rows.append((
            m, f"{fig['first_step_s'][m]:.2f}", f"{fig['first_step_s'][m] / fig['first_step_s']['warm']:.2f}x",
            f"{fig['wall_s'][m]:.2f}", f"{fig['wall_s'][m] / fig['wall_s']['warm']:.2f}x",
            f"{fig['enable_cache_ms'][m]:.1f}" if m in fig["enable_cache_ms"] else "-",
            f"{fig['import_jax_ms'][m]:.0f}",
        ))
    print_rows(rows)
    sh = fig["shape"]
    print(f"\nmedians of {fig['repeat']} runs per mode, each a fresh process (launch -> first step done; "
          f"wall: launch -> exit after {fig['steps_after_first']} more steps)")
    print(f"model: {sh['layers']} blocks, d_model {sh['d_model']}, {sh['heads']} heads, seq {sh['seq']}, "
          f"batch {sh['batch']}, vocab {sh['vocab']}; {fig['entries_written']} cache entries, "
          f"{fig['entry_bytes'] / 1024:.0f} KiB; first-step loss {fig['first_loss']:.4f} in every mode")
    print(f"time to first step, cold/warm: {fig['first_step_cold_vs_warm']:.2f}x   nocache/warm: "
          f"{fig['first_step_nocache_vs_warm']:.2f}x   cold/nocache: {fig['first_step_cold_vs_nocache']:.2f}x")
    print(f"process wall, cold/warm: {fig['wall_cold_vs_warm']:.2f}x   "
          f"nocache/warm: {fig['wall_nocache_vs_warm']:.2f}x")
    for m, s in fig["stats"].items():
        print(f"session stats ({m}, medians): {s.get('hits', 0):g} hits, {s.get('misses', 0):g} misses, "
              f"{s.get('writes', 0):g} writes, compile {s.get('compile_s', 0):.2f} s, retrieval "
              f"{s.get('retrieval_s', 0):.3f} s, saved {s.get('saved_s', 0):.2f} s")
    kp = fig["key_parts"]
    print(f"\nkey parts captured (JAXCACHE_KEY_PARTS on) vs not, time to first step, medians of {kp['repeat']} rounds:"
          f" cold {kp['first_step_s']['cold-on']:.2f} vs {kp['first_step_s']['cold-off']:.2f} s ="
          f" {kp['cold_on_vs_off']:.3f} (target <= {kp['target']:.2f}; A/A on/on {kp['cold_again_vs_on']:.3f}),"
          f" warm {kp['first_step_s']['warm-on']:.2f} vs {kp['first_step_s']['warm-off']:.2f} s ="
          f" {kp['warm_on_vs_off']:.3f}; median of the rounds' own ratios: cold {kp['cold_on_vs_off_median_round']:.3f}"
          f" (A/A {kp['cold_again_vs_on_median_round']:.3f}), warm {kp['warm_on_vs_off_median_round']:.3f}")
    sd = fig["steady"]

    def span(xs: list[float]) -> str:
        return f"{min(xs):.3f}..{max(xs):.3f}"

    print(f"\nsteady state: {sd['steps']} steps after the first, medians of {sd['repeat']} rounds of fresh processes "
          "(same compiled program, loaded from the warm cache)")
    rows = [("arm", "loop s", "ms/step", "vs without", "per round", "fastest chunk ms/step", "vs without")]
    for arm, key in (("without", None), ("with", "with_vs_without"), ("without-again", "again_vs_without")):
        rows.append((
            arm if arm != "without-again" else "without again (A/A)", f"{sd['loop_s'][arm]:.3f}",
            f"{sd['step_ms'][arm]:.2f}", f"{sd[key]:.3f}" if key else "1",
            span(sd[f"{key}_per_round"]) if key else "-", f"{sd['best_chunk_step_ms'][arm]:.2f}",
            f"{sd[key + '_best_chunk']:.3f}" if key else "1",
        ))
    print_rows(rows)
    print(f"with/without client: {sd['with_vs_without']:.3f}; the noise yardstick, without/without (A/A): "
          f"{sd['again_vs_without']:.3f}")
    ev = sd["events_and_log_records_in_loops"]
    print("jax.monitoring events + JAX cache log records during the timed loops: "
          + ", ".join(f"{k} {v}" for k, v in ev.items()) + " (what the client's listeners and log tap could run on)")
    im = fig["imports"]
    print(f"\nimport jaxcache.client on top of import jax: {im['import_client_ms']:.1f} ms median of {im['repeat']} "
          f"(target <= {im['target_ms']:.0f} ms), {im['import_client_vs_jax']:.1%} of import jax "
          f"({im['import_jax_ms']:.0f} ms here: both scale with the machine's load)")
    for line in fig["odd"]:
        print(f"ODD: {line}")


def _source_version() -> str | None:
    """The commit measured, with ``+dirty`` when the client or core has uncommitted changes (None outside git)."""
    root = os.path.dirname(_HERE)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "client", "core"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _client_changed(before: str | None, after: str | None) -> bool:
    if before is None or after is None or before.endswith("+dirty") or after.endswith("+dirty"):
        return True
    diff = subprocess.run(["git", "diff", "--quiet", before, after, "--", "client", "core"],
                          cwd=os.path.dirname(_HERE), capture_output=True)
    return diff.returncode != 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/coldstart.py",
        description="Time to first train step and process wall time of a small transformer with no persistent "
        "cache, a cold and a warm jaxcache cache (fresh processes, medians, ratios within one run); "
        "enable_cache() and import cost; steady-state step time with and without the client.",
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per cold-start mode (default 5)")
    parser.add_argument("--steps", type=int, default=10, help="steps after the first in cold-start runs (default 10)")
    parser.add_argument("--steady-steps", type=int, default=1000, help="timed steps in steady state (default 1000)")
    parser.add_argument("--steady-repeat", type=int, default=5,
                        help="steady-state rounds: each runs without the client, with it, without again (default 5)")
    parser.add_argument("--import-repeat", type=int, default=7, help="import timing runs (default 7)")
    parser.add_argument("--parts-repeat", type=int, default=9,
                        help="rounds of starts with the key-part capture on and off (default 9)")
    parser.add_argument("--quick", action="store_true",
                        help="3 cold-start runs, 5 key-part rounds, 3x300 steady steps, 5 import runs (a smoke run;"
                        " ratios are noisier)")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    parser.add_argument("--d-model", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--seq", type=int, default=32, help="sequence length (default 32)")
    parser.add_argument("--batch", type=int, default=4, help="batch size (default 4)")
    parser.add_argument("--vocab", type=int, default=256, help="vocabulary (default 256)")
    parser.add_argument("--out", default=os.path.join(_HERE, "out", "coldstart.json"),
                        help="where to write the figures as JSON (default bench/out/coldstart.json)")
    parser.add_argument("--workdir", metavar="DIR", help="where to put the cache dirs (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the cache dirs instead of removing them")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.steady_steps, args.steady_repeat, args.import_repeat, args.parts_repeat = 3, 300, 3, 5, 5
    if min(args.repeat, args.steady_repeat, args.import_repeat, args.steady_steps, args.parts_repeat) < 1:
        parser.error("--repeat, --steady-repeat, --import-repeat, --parts-repeat and --steady-steps must be >= 1")
    if args.d_model % args.heads:
        parser.error("--d-model must be a multiple of --heads")

    began = time.perf_counter()
    source_before = _source_version()
    if args.workdir:
        work = os.path.abspath(args.workdir)
        os.makedirs(work, mode=0o700, exist_ok=True)
        if os.listdir(work):
            sys.exit(f"error: {work} is not empty")
    else:
        work = tempfile.mkdtemp(prefix="jaxcache-bench-coldstart-")
    try:
        runs = measure(args, work)
    finally:
        print(f"finished in {time.perf_counter() - began:.0f}s", file=sys.stderr)
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    fig = report(runs, args)
    fig["command"] = " ".join([os.path.relpath(sys.executable), *sys.argv])
    source_after = _source_version()
    fig["source"] = source_before if source_before == source_after else f"{source_before} -> {source_after}"
    if source_before != source_after and _client_changed(source_before, source_after):
        fig["odd"].append(f"the client or core changed during the run ({fig['source']}): measure again")
    emit(fig, args.out, args.json, print_table)
    if not args.json:
        print(f"\nmeasured at {fig['source'] or 'an unknown commit'}; figures and every run: "
              f"{os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
