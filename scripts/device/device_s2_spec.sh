#!/usr/bin/env bash
# Issue 4 on the H200: the 8B-shaped bench pair (trained default target + EAGLE-3 head,
# widened), `bench sweep` over it (policies x concurrency, JSON + PNG) and `bench spec-tax`
# (decode step with no draft vs draft configured at policy off, batch 1 / 32 / 128).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
if [ ! -f /tmp/big/config.json ]; then
  timeout 150 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
    --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
    > "$OUT/make_bench.txt" 2>&1; tail -2 "$OUT/make_bench.txt"
fi
if [ "${SWEEP:-1}" = 1 ]; then
  timeout ${SWEEP_TIMEOUT:-330} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
    --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.txt" 2>&1
  tail -25 "$OUT/sweep.txt"
fi
if [ "${TAX:-1}" = 1 ]; then
  timeout 200 $G bench spec-tax --model /tmp/big --draft-model /tmp/bighead \
    --output-json "$OUT/spec_tax.json" > "$OUT/spec_tax.txt" 2>&1; tail -12 "$OUT/spec_tax.txt"
fi
