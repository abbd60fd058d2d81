#!/usr/bin/env bash
# Session 10, call E: goodput's host work after scoring small batches in plain Python
# (GoodputPolicy.python_max): always-4, goodput and goodput-shadow at c = 8, every step
# recorded (scripts/diag_goodput_steps.py). Call D measured goodput-shadow's steady K = 4
# VERIFY steps at batch 8 0.10 ms over always-4's (7.35 vs 7.26 ms, equal device time).
# POLICIES, CONC, PASSES and END (the second by which the diag must stop) override the
# defaults.
# Usage (device tool): bash scripts/device/device_s10_e.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 90 python -m gearshift.cli make-bench-model --shape llama-3.1-8b --out /tmp/big \
  --device cuda --head gearshift/default_model/eagle3 --head-out /tmp/bighead \
  --head-draft-vocab 32000 > "$OUT/make_bench.txt" 2>&1
timeout $((${END:-175} - SECONDS)) python scripts/diag_goodput_steps.py --model /tmp/big \
  --draft-model /tmp/bighead --concurrency ${CONC:-8} --rounds 3 --passes ${PASSES:-5} \
  --policies ${POLICIES:-always-4,goodput,goodput-shadow} --out "$OUT/steps.json" 2>&1 \
  | grep -v "it/s" > "$OUT/log.txt"
tail -40 "$OUT/log.txt"
