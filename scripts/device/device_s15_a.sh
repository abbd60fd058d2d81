#!/usr/bin/env bash
# Prepared in session 14 for the next session's first issue-2 call (not yet run).
# scripts/bench_fused_gemm.py modes 0 (plain kernel), 3 (norm weight folded into W, the
# squares taken from the x tile that feeds the dot: near the plain kernel at 64 rows in
# session 14, but wrong at some tilings) and 6 (as 3, the squares from a second load of x,
# so no load feeds both a dot and elementwise code). If mode 6 is right at every tiling
# and near mode 0, folding post_attention_layernorm's weight into gate_up and fusing the
# norm there would save ~7 us a layer at 64 rows (docs/benchmarks/2026-11-30-h200-session14.md).
# Usage (device tool): bash scripts/device/device_s15_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 400 python scripts/bench_fused_gemm.py --modes 0 3 6 --out "$OUT/fused.json" > "$OUT/fused.log" 2>&1
echo "bench_fused_gemm rc $?"; cat "$OUT/fused.log"
