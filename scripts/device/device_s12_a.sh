#!/usr/bin/env bash
# Session 12, call F: issue 4's GPU checks on the code whose full sweep and confirmation
# (calls A, B, D, E) passed: every GPU test of speculation (the random-policy soak in fp32,
# the trap under CUDA graphs, chain / tree / plain steps mixed, EXTEND graphs, prepare inside
# verify), then `bench burst` and `bench spec-tax` on the 8B-shaped bench pair (session 6's
# call A without its own, narrower, test selection).
# Usage (device tool): bash scripts/device/device_s12_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 220 python -m pytest -q -p no:cacheprovider tests/gpu/test_random_soak.py \
  tests/gpu/test_gpu_engine.py tests/gpu/test_extend_graphs.py tests/e2e/test_spec_trap.py \
  tests/e2e/test_spec_policy_prepare.py 2>&1 | tail -25 > "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt"
TESTS=0 END=$((570 - SECONDS)) exec bash "$(dirname "$0")/device_s6_a.sh"
