#!/usr/bin/env bash
# Ran at commit 29f2f6e with .cache/lt carried (a copy of sustained.py is under docs/benchmarks/2026-12-01-h200-session20/e-sustained-gemms/).
# Session 20, call E (carry .cache/lt: b1c4451's kernels/cublaslt.py and sustained.py): the
# 512-row layer GEMMs under sustained load, at the power cap the offline run sits at
# (call C: 700 W, SM clocks ~1.5 GHz in mixed steps): cuBLAS's pick against every cuBLASLt
# heuristic candidate, time, energy (NVML) and SM clock per call.
# Usage (device tool): bash scripts/device/device_s20_e.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 300 python .cache/lt/sustained.py 512 "$OUT/sustained512.json" 2>&1 | grep -v Warn > "$OUT/log.txt"
cat "$OUT/log.txt"
