#!/usr/bin/env bash
# Session 15, call F: TMA GEMMs with the RMSNorm folded in (norm weight in W, each row's
# rstd from the x tiles it streams) and with the residual add in the epilogue, against the
# plain TMA GEMM and the add + RMSNorm kernel they would remove (8B shapes, 1 and 64 rows).
# Usage (device tool): bash scripts/device/device_s15_f.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 400 python scripts/bench_tma_gemm.py --fused --out "$OUT/fused.json" > "$OUT/fused.log" 2>&1
echo "bench_tma_gemm --fused rc $?"; grep -v Warning "$OUT/fused.log" | tail -70
