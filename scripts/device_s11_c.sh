#!/usr/bin/env bash
# Session 11, call C: why goodput ran 166 chain steps beside 444 tree steps at c = 1 with no
# gear switch (call A). Every step of goodput, always-4 and the tree at c = 1, 2, 4, 8, with
# goodput's running gear and the reason for each plan's gear (scripts/diag_goodput_steps.py).
# Usage (device tool): bash scripts/device_s11_c.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 90 python -m gearshift.cli make-bench-model --shape llama-3.1-8b --out /tmp/big \
  --device cuda --head gearshift/default_model/eagle3 --head-out /tmp/bighead \
  --head-draft-vocab 32000 > "$OUT/make_bench.txt" 2>&1
timeout $((${END:-330} - SECONDS)) python scripts/diag_goodput_steps.py --model /tmp/big \
  --draft-model /tmp/bighead --concurrency ${CONC:-1,2,4,8} --rounds 3 --passes ${PASSES:-3} \
  --policies ${POLICIES:-goodput,always-4,tree} --out "$OUT/steps.json" 2>&1 \
  | grep -v "it/s" > "$OUT/log.txt"
tail -60 "$OUT/log.txt"
