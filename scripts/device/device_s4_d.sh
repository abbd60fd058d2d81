#!/usr/bin/env bash
# Session 4, call D (last): the full sweep (chain policies, rotated first policy; the tree),
# after the population prior, aging of acceptance evidence, catch-up-free costs.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/start.txt"
[ -f /tmp/big/config.json ] && [ -f /tmp/bighead/config.json ] && echo "bench pair kept from call C" || \
  timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout ${SWEEP_TIMEOUT:-480} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.log" 2>&1
grep -v "it/s\]" "$OUT/sweep.log" | tail -3 | cut -c1-200
python scripts/sweep_table.py "$OUT/sweep.json" --png "$OUT/sweep_table.png" 2>&1 | tail -25
date -u +%FT%TZ >> "$OUT/start.txt"
