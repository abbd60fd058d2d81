#!/usr/bin/env bash
# Session 15, call H: the extend kernel's decoder path (1-token requests as group-of-heads
# tiles) on / off, on the mixed-step cases of scripts/bench_extend_attn.py; then the
# extend kernel tests on the GPU.
# Usage (device tool): bash scripts/device/device_s15_h.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 300 python scripts/bench_extend_attn.py --out "$OUT/extend.json" > "$OUT/extend.log" 2>&1
echo "bench_extend_attn rc $?"; grep -v Warning "$OUT/extend.log" | tail -60
timeout 200 python -m pytest -q -p no:cacheprovider tests/kernels/test_extend_kernel.py > "$OUT/tests.log" 2>&1
echo "extend tests rc $?"; tail -3 "$OUT/tests.log"
