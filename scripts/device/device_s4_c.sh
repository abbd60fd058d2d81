#!/usr/bin/env bash
# Session 4, call C: the EXTEND-graph GPU tests (warm-up now restores graph_stats), then per-step
# timings of goodput vs always-4 at c = 2 and 32 (scripts/diag_steps.py).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/start.txt"
timeout 60 python -m pytest -q -p no:cacheprovider tests/gpu/test_extend_graphs.py > "$OUT/gpu_tests.txt" 2>&1
tail -2 "$OUT/gpu_tests.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout 200 python scripts/diag_steps.py --model /tmp/big --draft-model /tmp/bighead --out "$OUT" \
  > "$OUT/diag_steps.log" 2>&1; grep "^c=" "$OUT/diag_steps.log" | cut -c1-700; tail -2 "$OUT/diag_steps.log" | cut -c1-300
date -u +%FT%TZ >> "$OUT/start.txt"
