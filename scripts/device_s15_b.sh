#!/usr/bin/env bash
# Session 15, call B: does L2 weight prefetch on a side stream (models/prefetch.py) shorten
# the 8B decoder layers in a DECODE graph at batch 1 (1k context) and batch 64 (640)?
# Usage (device tool): bash scripts/device_s15_b.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 500 python scripts/bench_l2_prefetch.py --out "$OUT/prefetch.json" > "$OUT/prefetch.log" 2>&1
echo "bench_l2_prefetch rc $?"; cat "$OUT/prefetch.log" | grep -v Warning | tail -60
