#!/usr/bin/env bash
# Session 4, call B: GPU tests, then the chain-policy sweep after the population prior,
# aging of acceptance evidence and catch-up-free cost observations.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/start.txt"
timeout 100 python -m pytest -q -p no:cacheprovider tests/gpu > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout ${SWEEP_TIMEOUT:-330} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --policies goodput,off,always-2,always-4,threshold,threshold-vllm \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.log" 2>&1
grep -v "it/s\]" "$OUT/sweep.log" | tail -3 | cut -c1-200
python scripts/sweep_table.py "$OUT/sweep.json" --png "$OUT/sweep_table.png" 2>&1 | tail -25
date -u +%FT%TZ >> "$OUT/start.txt"
