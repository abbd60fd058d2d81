#!/usr/bin/env bash
# Session 11, calls A and B: the full sweep (every policy, at real concurrency) of goodput
# with steady gears kept unscored between full scorings (GoodputPolicy.rescore_every).
# Call A: the goodput e2e tests on the GPU, then the c <= 16 half (3 rounds x 4 passes);
# call B: CONC=32,64,128,256 PASSES=2 TESTS=0 bash scripts/device/device_s11_b.sh
# then: python scripts/sweep_table.py a/sweep.json b/sweep.json --merged all.json --png all.png
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if [ "${TESTS:-1}" = 1 ]; then
  timeout 120 python -m pytest -q -p no:cacheprovider tests/e2e/test_spec_policy_prepare.py \
    tests/e2e/test_spec_trap.py 2>&1 | tail -15 > "$OUT/gpu_tests.txt"
  tail -3 "$OUT/gpu_tests.txt"
fi
END=$((585 - SECONDS)) CONC=${CONC:-1,2,4,8,16} ROUNDS=3 PASSES=${PASSES:-4} \
  bash scripts/device/device_s9_c.sh
