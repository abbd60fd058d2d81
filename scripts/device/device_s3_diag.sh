#!/usr/bin/env bash
# Session 3, first device call: GPU tests (kernels + engine), the 8B-shaped bench pair,
# the acceptance-vs-concurrency diagnostic (alone vs together, graphs vs eager), and a
# reduced sweep of goodput against off / always-4 with the fixes since session 2's run.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
timeout ${TEST_TIMEOUT:-170} python -m pytest -q -p no:cacheprovider tests/kernels tests/gpu \
  > "$OUT/gpu_tests.txt" 2>&1; tail -6 "$OUT/gpu_tests.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt"
timeout ${DIAG_TIMEOUT:-150} python scripts/diag_acceptance.py --model /tmp/big --draft-model /tmp/bighead \
  --num-prompts 16 --variants graphs,eager --out "$OUT/diag.json" > "$OUT/diag.txt" 2>&1
grep -v "it/s\]" "$OUT/diag.txt" | tail -6 | cut -c1-400
timeout ${SWEEP_TIMEOUT:-170} $G bench sweep --model /tmp/big --draft-model /tmp/bighead \
  --policies ${POLICIES:-goodput,off,always-4} --concurrency ${CONCS:-1,4,16,64,256} \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png" > "$OUT/sweep.txt" 2>&1
grep -v "it/s\]" "$OUT/sweep.txt" | tail -12 | cut -c1-160
