#!/usr/bin/env bash
# Session 15, call C: the skinny GEMM with deeper pipelines (6 / 8 stages) and a TMA
# variant, against cuBLAS, on the 8B layer shapes at 1 and 64 rows.
# Usage (device tool): bash scripts/device/device_s15_c.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 540 python scripts/bench_tma_gemm.py --out "$OUT/tma.json" > "$OUT/tma.log" 2>&1
echo "bench_tma_gemm rc $?"; grep -v Warning "$OUT/tma.log" | tail -40
