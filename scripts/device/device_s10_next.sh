#!/usr/bin/env bash
# Prepared in session 9 for the next session's first call (not yet run): the GPU tests of
# the final session-9 code (deferred cost observations, shared drift, fewer plain probes),
# then the c <= 16 half of the full sweep at real concurrency (every policy; 3 rounds x 4
# passes, as session 9's call D). The second call: the c >= 32 half,
#   CONC=32,64,128,256 ROUNDS=3 PASSES=2 bash scripts/device/device_s9_c.sh
# then: python scripts/sweep_table.py a/sweep.json b/sweep.json --merged all.json --png all.png
# Usage (device tool): bash scripts/device/device_s10_next.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu/test_random_soak.py \
  tests/gpu/test_gpu_engine.py tests/gpu/test_extend_graphs.py tests/e2e/test_spec_trap.py \
  tests/e2e/test_spec_policy_prepare.py 2>&1 | tail -25 > "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt"
END=$((585 - SECONDS)) CONC=1,2,4,8,16 ROUNDS=3 PASSES=4 bash scripts/device/device_s9_c.sh
