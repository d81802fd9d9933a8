#!/usr/bin/env bash
# Run HERE, on a CPU machine with .venv-tpu (make test builds it): fills .tpu-carry/ (git-ignored) for
# bench/tpu_check.sh's one device call: (1) the cache, warmed for the lent chip (v5e:1x1, its image's
# LIBTPU_INIT_ARGS mirrored) with bench/tpu_model.py's train step; (2) wheels of jaxcache's dependencies that the
# device lacks (its own JAX 0.10.2 and libtpu stay). bench/README.md, "On a lent TPU".
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.tpu-carry
PY=${TPU_PYTHON:-.venv-tpu/bin/python}
FLAGS=${TPU_LIBTPU_INIT_ARGS:---xla_tpu_use_enhanced_launch_barrier=true}
rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"
start=$(date +%s.%N)
PYTHONPATH=$PWD "$PY" -m jaxcache.warmup --platform tpu --topology v5e:1x1 --cache-dir "$CARRY/cache" \
  --entrypoint bench.tpu_model:warm --job tpu-warmup --libtpu-init-args="$FLAGS" 2>&1 | grep -v '^[IEW]0000\|accelerator type' \
  | tee "$CARRY/warmup.txt"
echo "warm-up wall s: $(echo "$(date +%s.%N) - $start" | bc)" | tee -a "$CARRY/warmup.txt"
pins=$("$PY" - <<'PY'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("zstandard", "msgspec", "filelock", "tqdm", "cryptography", "cffi",
                                              "pycparser")))
PY
)
for pin in $pins; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$CARRY/wheels" "$pin"
done
ls -la "$CARRY/wheels" && du -sh "$CARRY"
