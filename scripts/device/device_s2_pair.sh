#!/usr/bin/env bash
# Issues 4 + 6 on the H200 (one device call): GPU spec tests, the 8B-shaped bench pair,
# `bench sweep` over it, then `bench pair` (cost vs preset, greedy and acceptance equality).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
timeout 60 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_gpu_engine.py -k "eagle or spec" \
  2>&1 | tail -3
timeout 150 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout ${SWEEP_TIMEOUT:-290} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.txt" 2>&1
tail -14 "$OUT/sweep.txt" | cut -c1-150
timeout ${PAIR_TIMEOUT:-200} $G bench pair --big /tmp/big --big-head /tmp/bighead \
  --output-json "$OUT/pair.json" > "$OUT/pair.txt" 2>&1; grep -v "tok/s" "$OUT/pair.txt" | tail -25
