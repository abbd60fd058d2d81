#!/usr/bin/env bash
# Session 5, call E (last): GPU tests of the skinny GEMM as committed (graph-timed chooser),
# then the full sweep (chain policies and the tree; probe back-off and the tree engine's
# start-up after the chain engine, neither measured before). The sweep saves after every
# point, so a cut run keeps what it measured. Usage (device tool): bash scripts/device/device_s5_e.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/log.txt"
timeout 100 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  tests/gpu/test_skinny_model.py 2>&1 | tail -15 > "$OUT/gpu_tests.txt"; tail -3 "$OUT/gpu_tests.txt" >> "$OUT/log.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/log.txt"
echo "sweep budget: $((575 - SECONDS)) s" >> "$OUT/log.txt"
timeout $((575 - SECONDS)) $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.log" 2>&1
echo "sweep rc $?" >> "$OUT/log.txt"
grep -v "it/s\]" "$OUT/sweep.log" | tail -4 | cut -c1-200 >> "$OUT/log.txt"
python scripts/sweep_table.py "$OUT/sweep.json" --png "$OUT/sweep_table.png" >> "$OUT/log.txt" 2>&1
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
