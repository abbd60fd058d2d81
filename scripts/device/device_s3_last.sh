#!/usr/bin/env bash
# Session 3, last device call: the warm-up GPU test, then on the 8B-shaped bench pair the
# full `bench sweep` (chain policies + tree) and `bench burst`, with every fix of the session.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
timeout 45 python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_engine.py -k warms_up \
  > "$OUT/gpu_test_warmup.txt" 2>&1; tail -2 "$OUT/gpu_test_warmup.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout ${SWEEP_TIMEOUT:-250} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.log" 2>&1
grep -v "it/s\]" "$OUT/sweep.log" | tail -3 | cut -c1-200
timeout ${BURST_TIMEOUT:-90} $G bench burst --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/burst.json" > "$OUT/burst.log" 2>&1; grep -v "it/s\]" "$OUT/burst.log" | tail -6
