#!/usr/bin/env bash
# Session 8, call D: GPU tests after the host-path changes (graph inputs by _foreach_copy_,
# one-copy Stager with int32 parts, accounting after the draft launch, goodput's prepare);
# VERIFY host phases again (scripts/diag_verify_host.py, no trace); then the focus sweep
# c = 1..16 (8 passes) in the remaining time.
# Usage (device tool): bash scripts/device/device_s8_d.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/tests_log.txt"
timeout 220 python -m pytest -q -p no:cacheprovider tests/gpu/test_random_soak.py \
  tests/gpu/test_gpu_engine.py tests/gpu/test_extend_graphs.py tests/e2e/test_spec_trap.py \
  2>&1 | tail -25 > "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt" >> "$OUT/tests_log.txt"
echo "tests took ${SECONDS} s" >> "$OUT/tests_log.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/tests_log.txt"
timeout 100 python scripts/diag_verify_host.py --model /tmp/big --draft-model /tmp/bighead \
  --points always-4:1,goodput:1,always-4:8,always-4:32 --steps 100 \
  --out "$OUT/diag_verify_host.json" 2>&1 | grep -v "Token indices" >> "$OUT/tests_log.txt"
echo "diag done at ${SECONDS} s" >> "$OUT/tests_log.txt"
cat "$OUT/tests_log.txt"
END=$((585 - SECONDS)) CONC=${CONC:-1,2,4,8,16} PASSES=${PASSES:-8} bash scripts/device/device_focus.sh
