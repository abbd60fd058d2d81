#!/usr/bin/env bash
# Session 17, call D: RoPE + the K/V store inside the decode kernel
# (GEARSHIFT_DECODE_ROPE=fused) against the RoPE kernel first (separate): batch-1 decode
# and offline (budget 512) alternating, then the decode-kernel and engine GPU tests.
# Usage (device tool): bash scripts/device/device_s17_d.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source "$(dirname "$0")/device_common.sh"
date -u +%FT%TZ > "$OUT/log.txt"
for v in fused separate fused separate; do
  GEARSHIFT_DECODE_ROPE=$v bs1_run "rope $v" "$v.$RANDOM"
done
for v in fused separate fused separate; do
  GEARSHIFT_DECODE_ROPE=$v offline_run "rope $v" "$v.$RANDOM"
done
timeout 170 python -m pytest -q -p no:cacheprovider tests/kernels/test_decode_kernel.py \
  tests/gpu/test_gpu_engine.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
