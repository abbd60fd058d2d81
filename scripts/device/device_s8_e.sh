#!/usr/bin/env bash
# Session 8, call E: VERIFY host phases by gear for goodput, the tree and always-4 at c = 1
# (goodput's tree steps cost ~0.2 ms more than the tree policy's in call D); then the
# focus sweep c = 32..256 (8 passes) in the remaining time.
# Usage (device tool): bash scripts/device/device_s8_e.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/diag_log.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/diag_log.txt"
timeout 80 python scripts/diag_verify_host.py --model /tmp/big --draft-model /tmp/bighead \
  --points goodput:1,tree:1,always-4:1 --steps 200 \
  --out "$OUT/diag_verify_host.json" 2>&1 | grep -v "Token indices" >> "$OUT/diag_log.txt"
echo "diag done at ${SECONDS} s" >> "$OUT/diag_log.txt"
END=$((585 - SECONDS)) CONC=${CONC:-32,64,128,256} PASSES=${PASSES:-8} bash scripts/device/device_focus.sh
