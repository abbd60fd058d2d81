#!/usr/bin/env bash
# Session 4, call A: on the 8B-shaped bench pair, (1) does the start-up warm-up measure what
# real steps cost (scripts/diag_warmup.py), (2) the chain-policy sweep with the GC freeze,
# interleaved passes and goodput's fresh-neighbour exploration.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/start.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout ${DIAG_TIMEOUT:-130} python scripts/diag_warmup.py --model /tmp/big --draft-model /tmp/bighead \
  --sizes 1,2,8 --steps 16 --out "$OUT" > "$OUT/diag_warmup.log" 2>&1
grep "^bs " "$OUT/diag_warmup.log" | cut -c1-400; tail -2 "$OUT/diag_warmup.log" | cut -c1-300
timeout ${SWEEP_TIMEOUT:-330} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --policies goodput,off,always-2,always-4,threshold,threshold-vllm \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.log" 2>&1
grep -v "it/s\]" "$OUT/sweep.log" | tail -3 | cut -c1-200
python scripts/sweep_table.py "$OUT/sweep.json" --png "$OUT/sweep_table.png" 2>&1 | tail -25
date -u +%FT%TZ >> "$OUT/start.txt"
