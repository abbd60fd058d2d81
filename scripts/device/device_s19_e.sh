#!/usr/bin/env bash
# Session 19, call H: does the skinny chooser's isolated timing undersell the kernels that
# launch under PDL? The chooser times each product alone (no kernel before it to overlap);
# in the step, our kernels launch early and prefetch weights into L2 during the previous
# kernel's tail, cuBLAS's do not. At 64 rows o_proj / down lose to cuBLAS by 4-9% alone.
# GEARSHIFT_SKINNY_MARGIN=1.1 (take the kernel within 10% of cuBLAS) against the default
# 0.97, offline, alternating, two pairs; the chooser's picks are in each run's JSON.
# Usage (device tool): bash scripts/device/device_s19_e.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source scripts/device/device_common.sh
date -u +%FT%TZ > "$OUT/log.txt"
for i in 1 2; do
  GEARSHIFT_SKINNY_MARGIN=1.1 offline_run "margin 1.1 $i" m110_$i
  offline_run "margin 0.97 $i" m097_$i
done
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
