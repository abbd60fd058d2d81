#!/usr/bin/env bash
# Session 8, call B: where a VERIFY step's wall time goes on the H200 (8B bench pair):
# host phases, the sync's wait, the device's idle gaps (scripts/diag_verify_host.py).
# Usage (device tool): bash scripts/device/device_s8_b.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/log.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/log.txt"
timeout $((580 - SECONDS)) python scripts/diag_verify_host.py --model /tmp/big \
  --draft-model /tmp/bighead --trace --out "$OUT/diag_verify_host.json" \
  --points "${POINTS:-always-4:1,goodput:1,tree:1,always-4:8,goodput:8,always-4:32,goodput:32}" \
  2>&1 | grep -v "Token indices" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
