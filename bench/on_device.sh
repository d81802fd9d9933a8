#!/usr/bin/env bash
# Everything a lent GPU machine is for, in one call (bench/README.md, "On a lent GPU machine"):
#   (1) bench/gpu_check.sh;
#   (2) where the machine has more than 2 cores: the service's figures with the service pinned to CPUs 0 and 1 and
#       the load (clients, probes, wrk) on the others, so that the load generator takes none of the service's two
#       cores: the report storm (bench/reports.py, SQLite, --split) and listing pages and 304s (bench/api.py);
#   (3) the report storm again with the service on every core.
# Installs nothing. PYTHON (default .venv/bin/python) must have jaxcache's four parts and their dependencies, and a
# `jaxcache` script beside it; wrk must be on PATH for (2)'s listing figures. Outputs go to $OUT (or bench/out).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHON=${PYTHON:-.venv/bin/python} PYTHONUNBUFFERED=1
OUTDIR=${OUT:-bench/out}
mkdir -p "$OUTDIR"
step() { echo "== $* ($(date -u +%T))"; }

step "(1) gpu_check"
STEP_S=${STEP_S:-120} timeout 480 bash bench/gpu_check.sh

cpus=$(nproc)
if [ "$cpus" -le 2 ]; then
  step "only $cpus CPUs: nothing to pin apart"
  exit 0
fi
load="2-$((cpus - 1))"
source_dir=$(mktemp -d)
trap 'rm -rf "$source_dir"' EXIT
JAX_PLATFORMS=cpu $PYTHON -m jaxcache.warmup.demo "$source_dir" >/dev/null || exit 1

step "(2) report storm, the service on CPUs 0,1, the load on $load"
timeout 170 taskset -c "$load" $PYTHON bench/reports.py --catalogs sqlite --workers 2 --split --service-cpus 0,1 \
  --settle-s 60 --source "$source_dir" 2>&1 | tee "$OUTDIR/reports_2cpus.txt"
step "(2) listing pages and 304s, the service on CPUs 0,1, wrk on $load"
timeout 150 taskset -c "$load" $PYTHON bench/api.py --entries 20000 --workers 2 --service-cpus 0,1 --seconds 3 \
  --distinct 200 --source "$source_dir" 2>&1 | tee "$OUTDIR/api_2cpus.txt"
step "(3) report storm, the service on all $cpus CPUs"
timeout 150 $PYTHON bench/reports.py --catalogs sqlite --workers 4 --split --settle-s 60 --source "$source_dir" 2>&1 \
  | tee "$OUTDIR/reports_all.txt"
step "done"
