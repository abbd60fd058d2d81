#!/usr/bin/env bash
# Session 16, call E: the TMA tile kernel at 256 / 512 rows against cuBLAS
# (scripts/bench_wide_gemm.py), then the GPU kernel and model tests with PDL on.
# Usage (device tool): bash scripts/device/device_s16_e.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python scripts/bench_wide_gemm.py --out "$OUT/wide_gemm.json" > "$OUT/wide_gemm.log" 2>&1
echo "wide gemm rc $?"
timeout 240 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  tests/kernels/test_decode_kernel.py tests/kernels/test_fused_ops.py tests/gpu/test_skinny_model.py \
  tests/gpu/test_gpu_engine.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?"; tail -4 "$OUT/gpu_tests.log"
grep -v "^$" "$OUT/wide_gemm.log" | cut -c1-110
