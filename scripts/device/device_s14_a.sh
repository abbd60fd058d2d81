#!/usr/bin/env bash
# Prepared in session 13 for the next session's first issue-2 call (not yet run).
# scripts/bench_splitk_gemm.py: a split-K weight-streaming GEMM (the last split sums the
# partials, one launch) against cuBLAS and the skinny kernel on the 8B layer shapes at the
# batch-64 decode's 64 rows (and at 16 / 32: the padded batches between). Session 13's
# batch-64 profile has the layer GEMMs 21 us a layer over their weight-streaming floor
# (docs/benchmarks/2026-11-30-h200-session13.md). A winner would become a chooser
# candidate (gearshift/models/kernels/), then be measured in the engine (device_s13_f.sh's
# A/B).
# Usage (device tool): bash scripts/device/device_s14_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 500 python scripts/bench_splitk_gemm.py --rows 64 32 16 --out "$OUT/splitk.json" \
  > "$OUT/splitk.log" 2>&1
echo "bench_splitk_gemm rc $?"; cat "$OUT/splitk.log"
