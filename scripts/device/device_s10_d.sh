#!/usr/bin/env bash
# Session 10, call D: (1) goodput's host work apart from its choices at c = 8, where it
# trailed always-4 by 3.5% in two sweeps at the same K mix (97% K = 4) and device time:
# always-4, goodput and goodput-shadow (goodput's host work, always K = 4), every step
# recorded, 8 passes (scripts/diag_goodput_steps.py); (2) the c >= 32 half of the
# confirmation sweep (scripts/device/device_s10_c.sh) in the time left.
# Usage (device tool): bash scripts/device/device_s10_d.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1
mkdir -p "$OUT/shadow"
timeout 200 python scripts/diag_goodput_steps.py --model /tmp/big --draft-model /tmp/bighead \
  --concurrency 8 --rounds 3 --passes 8 --policies always-4,goodput,goodput-shadow \
  --out "$OUT/shadow/steps.json" 2>&1 | grep -v "it/s" > "$OUT/shadow/log.txt"
tail -12 "$OUT/shadow/log.txt"
mkdir -p "$OUT/focus"
OUT=$OUT/focus END=$((590 - SECONDS)) CONC=32,64,128,256 PASSES=${PASSES:-3} \
  bash scripts/device/device_s10_c.sh
