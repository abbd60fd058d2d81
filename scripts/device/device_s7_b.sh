#!/usr/bin/env bash
# Session 7, call B: the GPU soak of the random policy (default model, fp32, chains and
# trees, preemption, opt-outs) and the GPU warm-up/tree tests; then the lower half of the
# sweep (c = 1..16) with 4 passes per point, after the padded split-K fix and the
# fresh-neighbour gate (fresh_ratio).
# Usage (device tool): bash scripts/device/device_s7_b.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/log.txt"
timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu/test_random_soak.py \
  tests/gpu/test_gpu_engine.py -k "soak or warms_up or tree" 2>&1 | tail -25 > "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt" >> "$OUT/log.txt"
echo "tests took ${SECONDS} s" >> "$OUT/log.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/log.txt"
echo "sweep budget: $((585 - SECONDS)) s" >> "$OUT/log.txt"
timeout $((585 - SECONDS)) $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --rounds 5 --passes 4 --concurrency 1,2,4,8,16 \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.log" 2>&1
echo "sweep rc $?" >> "$OUT/log.txt"
python scripts/sweep_table.py "$OUT/sweep.json" >> "$OUT/log.txt" 2>&1
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
