#!/usr/bin/env bash
# Prepared in session 17 for the next session, call A: the split-K TMA tilings
# (SkinnyConfig.split_k; opt-in chooser candidates at 1-16 and 64 rows under
# GEARSHIFT_SKINNY_SPLITK=1) first through the GPU skinny tests (bf16 split-K is only
# tested on a GPU), then batch-1 decode and offline (budget 512) with them and without;
# each run's JSON holds the chooser's picks and timings (skinny_gemm).
# Usage (device tool): bash scripts/device_s18_a.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  > "$OUT/gpu_tests.log" 2>&1
rc=$?; echo "gpu tests rc $rc" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
source "$(dirname "$0")/device_common.sh"
if [ $rc -eq 0 ]; then
  for v in 1 0; do GEARSHIFT_SKINNY_SPLITK=$v bs1_run "split-K candidates $v" "$v"; done
  for v in 1 0 1 0; do GEARSHIFT_SKINNY_SPLITK=$v offline_run "split-K candidates $v" "$v.$RANDOM"; done
fi
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
