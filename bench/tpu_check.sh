#!/usr/bin/env bash
# Run ON the lent TPU v5e chip, in one device call, after bench/tpu_prepare.sh filled .tpu-carry/ here (carry it):
#   (0) install the carried wheels (jaxcache's dependencies) in a temporary folder, the device's own JAX and libtpu first;
#   (1) `warmup --check` with the same entrypoint on the chip: every program the CPU warm-up stored must hit;
#   (2) the 6-layer decoder's train step through enable_cache() on a copy of the warmed cache (every program hits),
#       then cold on a fresh empty cache (a separate process), then warm again: first step against cold, same loss.
# Results: $OUT/tpu_check.json (and each run's JSON and log). bench/README.md, "On a lent TPU".
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=.tpu-carry
OUTDIR=${OUT:-bench/out}
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/tpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
step() { echo "== $* ($(date -u +%T))"; }
[ -d "$CARRY/cache" ] || { echo "no $CARRY/cache: run bench/tpu_prepare.sh here first and carry $CARRY"; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
step "(0) wheels"
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$W/site" "$CARRY"/wheels/*.whl || exit 1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$W/site:$PWD/core:$PWD/client:$PWD/warmup:$PWD
echo "LIBTPU_INIT_ARGS=${LIBTPU_INIT_ARGS:-} JAX_PLATFORMS=${JAX_PLATFORMS:-}"
ls -d /dev/accel* /dev/vfio/* 2>/dev/null
python3 -c 'import jax, importlib.metadata as m; print("jax", jax.__version__, "libtpu", m.version("libtpu"))'
cp -r "$CARRY/cache" "$W/warm" && mkdir -p "$W/cold"
step "(1) warmup --check on the chip"
python3 -m jaxcache.warmup --platform tpu --topology v5e:1x1 --cache-dir "$W/warm" --entrypoint bench.tpu_model:warm \
  --check --json > "$OUTDIR/check.json"
echo "check exit $?"; cat "$OUTDIR/check.json"; echo
sleep 5
step "(2a) warm: the train step through enable_cache() on the warmed cache"
python3 bench/tpu_model.py --cache-dir "$W/warm" --job tpu-warm --out "$OUTDIR/warm.json"
sleep 5
step "(2b) cold: a fresh empty cache"
python3 bench/tpu_model.py --cache-dir "$W/cold" --job tpu-cold --out "$OUTDIR/cold.json"
sleep 5
step "(2c) warm again"
cp -r "$CARRY/cache" "$W/warm2"
python3 bench/tpu_model.py --cache-dir "$W/warm2" --job tpu-warm --out "$OUTDIR/warm2.json"
step "(3) verdict"
python3 bench/tpu_verdict.py "$OUTDIR" "$CARRY/warmup.txt"
