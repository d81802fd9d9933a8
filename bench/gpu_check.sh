#!/usr/bin/env bash
# GPU check for warm-up (run it when a GPU machine is lent; never needed by the test suite; ~2-5 minutes).
# Installs nothing: needs a Python with jaxcache and jax[cuda12] installed (PYTHON, default: .venv/bin/python).
#   (1) warmup --topology 1x1x1 --platform gpu, then a fresh real job on the GPU: expect 100% hits.
#   (1b) jaxcache doctor --verify --json on what (1) wrote: the embedded-module check, pinned on CPU entries only,
#        checked on GPU entries (until it is, `mismatched` on a non-CPU entry does not act by itself).
#   (2) warmup --topology 1x2x1 (a 2-process job mocked on one GPU), then two real processes with
#       jax.distributed on 127.0.0.1 sharing that GPU compile the same program (no execution): report hits.
# Whatever happens, the outcome and the JAX version go to RESULTS (default: bench/out/gpu_check.txt, or
# $OUT/gpu_check.txt when OUT is set). Each step gets STEP_S seconds (default 300); one that runs out is stopped
# with SIGABRT, so Python's fault handler prints where every thread was (a hang's traceback) into the results.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
STEP_S=${STEP_S:-300}
export PYTHONFAULTHANDLER=1
step() { timeout -s ABRT "$STEP_S" "$@"; }
why() { [ "$1" -eq 124 ] && echo "timed out after $STEP_S s (where it was: below)" || echo "exit $1"; }
OUTDIR=${OUT:-bench/out}
mkdir -p "$OUTDIR"
RESULTS=${RESULTS:-$OUTDIR/gpu_check.txt}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
: > "$RESULTS"
say() { echo "$*" | tee -a "$RESULTS"; }

say "gpu_check $(date -u +%FT%TZ)"
say "versions: $($PYTHON -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__)' 2>&1)"
say "devices: $($PYTHON -c 'import jax; print(jax.devices())' 2>&1 | tail -1)"
nvidia-smi -L 2>&1 | sed 's/^/nvidia-smi: /' | tee -a "$RESULTS"

say "== (1) warmup 1x1x1 --platform gpu, then a real job"
step $PYTHON -m jaxcache.warmup --topology 1x1x1 --platform gpu --cache-dir "$WORK/c1" \
    --entrypoint jaxcache.warmup.examples:warm --verify >"$WORK/w1.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  say "warmup: ok"; sed 's/^/  /' "$WORK/w1.log" | tee -a "$RESULTS" >/dev/null
  JAXCACHE_DIR="$WORK/c1" step $PYTHON -m jaxcache.warmup.examples --steps 3 >"$WORK/j1.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    say "job: $(grep 'jaxcache:' "$WORK/j1.log")"
    grep -q 'hit rate 100%' "$WORK/j1.log" && say "(1) PASS: 100% hits" || say "(1) FAIL: not all hits"
  else
    say "(1) FAIL: the job failed, $(why $rc):"; tail -30 "$WORK/j1.log" | tee -a "$RESULTS"
  fi
else
  say "(1) FAIL: warmup failed, $(why $rc):"; tail -30 "$WORK/w1.log" | tee -a "$RESULTS"
fi

say "== (1b) doctor --verify on the GPU entries (1) wrote"
if [ -d "$WORK/c1" ]; then
  $PYTHON -m jaxcache doctor "$WORK/c1" --verify --min-age 0s --json >"$WORK/v1.json" 2>"$WORK/v1.err"
  say "doctor --verify exit $?: $($PYTHON -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["counts"], [(e["class"], e["embedded_module"], e["key"][:40]) for e in d["entries"]])' "$WORK/v1.json" 2>&1 | head -c 2000)"
  grep -q '"mismatched": 0' "$WORK/v1.json" && say "(1b) PASS: no mismatched GPU entry" \
    || say "(1b) CHECK: mismatched GPU entries above: the embedded-module check does not hold on GPU as written"
fi

say "== (2) warmup 1x2x1 (mocked on one GPU), then 2 real processes sharing the GPU"
step $PYTHON -m jaxcache.warmup --topology 1x2x1 --platform gpu --cache-dir "$WORK/c2" \
    --entrypoint jaxcache.warmup.examples:warm --json >"$WORK/w2.json" 2>"$WORK/w2.log"
rc=$?
if [ $rc -eq 0 ]; then
  say "warmup: $(tail -c 400 "$WORK/w2.json")"
  PORT=$($PYTHON -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 XLA_PYTHON_CLIENT_PREALLOCATE=false
  for i in 0 1; do
    step $PYTHON bench/gpu_two_process.py "127.0.0.1:$PORT" "$i" "$WORK/c2" >"$WORK/p$i.out" 2>"$WORK/p$i.err" &
  done
  wait
  for i in 0 1; do
    if [ -s "$WORK/p$i.out" ]; then say "process $i: $(tail -1 "$WORK/p$i.out")"
    else say "process $i FAILED:"; tail -15 "$WORK/p$i.err" | tee -a "$RESULTS"; fi
  done
else
  say "(2) FAIL: warmup 1x2x1 failed, $(why $rc):"; tail -40 "$WORK/w2.log" | tee -a "$RESULTS"
fi
say "results in $RESULTS"
