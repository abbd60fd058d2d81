#!/usr/bin/env bash
# Session 6, call A: GPU tests of per-step tree width (a tree engine's warm-up with the tree
# gear, chain / tree / plain steps mixed under CUDA graphs, the trap flipping chains, trees
# and plain decode), then on the 8B-shaped bench pair: `bench burst` (acceptance after a
# burst) and `bench spec-tax` (draft configured at spec_policy off vs none).
# END: the second of the call by which spec-tax must stop (default 580); TESTS=0 skips the
# GPU tests, SPEC_TAX=0 spec-tax (session 12, call G: TESTS=0 SPEC_TAX=0, burst alone).
# Usage (device tool): bash scripts/device/device_s6_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/log.txt"
if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: a caller ran its own GPU tests first
  timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_engine.py \
    tests/e2e/test_spec_trap.py -k "tree or larger_batch or warms_up or flipping or on_gpu" \
    2>&1 | tail -25 > "$OUT/gpu_tests.txt"; tail -3 "$OUT/gpu_tests.txt" >> "$OUT/log.txt"
fi
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/log.txt"
timeout 110 $G bench burst --model /tmp/big --draft-model /tmp/bighead \
  --output-json "$OUT/burst.json" > "$OUT/burst.log" 2>&1
echo "burst rc $?" >> "$OUT/log.txt"; grep -v "it/s\]" "$OUT/burst.log" | tail -10 >> "$OUT/log.txt"
if [ "${SPEC_TAX:-1}" = 1 ]; then  # SPEC_TAX=0: burst only
  END=${END:-580}
  echo "spec-tax budget: $((END - SECONDS)) s" >> "$OUT/log.txt"
  timeout $((END - SECONDS)) $G bench spec-tax --model /tmp/big --draft-model /tmp/bighead \
    --output-json "$OUT/spec_tax.json" > "$OUT/spec_tax.log" 2>&1
  echo "spec-tax rc $?" >> "$OUT/log.txt"; grep -v "it/s\]" "$OUT/spec_tax.log" | tail -12 >> "$OUT/log.txt"
fi
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
