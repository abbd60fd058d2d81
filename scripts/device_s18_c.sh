#!/usr/bin/env bash
# Session 18, call C: the stream-K TMA tilings (models/kernels/skinny_streamk.py; opt-in
# chooser candidates under GEARSHIFT_SKINNY_STREAMK=1) through the GPU skinny tests, then
# batch-1 decode and offline (budget 512) with them and without, alternating; each run's
# JSON holds the chooser's picks and timings (skinny_gemm).
# Usage (device tool): bash scripts/device_s18_c.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  > "$OUT/gpu_tests.log" 2>&1
rc=$?; echo "gpu tests rc $rc" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
source "$(dirname "$0")/device_common.sh"
if [ $rc -eq 0 ]; then
  for v in 1 0; do GEARSHIFT_SKINNY_STREAMK=$v bs1_run "stream-K candidates $v" "$v"; done
  for v in 1 0 1 0; do GEARSHIFT_SKINNY_STREAMK=$v offline_run "stream-K candidates $v" "$v.$RANDOM"; done
fi
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
