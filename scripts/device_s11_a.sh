#!/usr/bin/env bash
# Prepared in session 10 for the next session (not yet run): where goodput's ~0.1 ms per
# VERIFY step at c = 8 goes (session 10, calls D and E). At c = 8, every step recorded:
#   always-4; goodput; goodput-shadow (goodput's host work, K = 4 always);
#   always-4-spin-100 / -300: always-4 with a busy wait of 100 / 300 us in the prepare window.
# Spin steps costing what always-4's do: the window is idle host time, and the shadow's
# extra time is what its work does to the host, not how long it takes. Spin steps 0.1 / 0.3 ms
# slower: the window is on the critical path. Usage (device tool): bash scripts/device_s11_a.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 90 python -m gearshift.cli make-bench-model --shape llama-3.1-8b --out /tmp/big \
  --device cuda --head gearshift/default_model/eagle3 --head-out /tmp/bighead \
  --head-draft-vocab 32000 > "$OUT/make_bench.txt" 2>&1
timeout $((560 - SECONDS)) python scripts/diag_goodput_steps.py --model /tmp/big \
  --draft-model /tmp/bighead --concurrency 8 --rounds 3 --passes ${PASSES:-8} \
  --policies always-4,goodput,goodput-shadow,always-4-spin-100,always-4-spin-300 \
  --out "$OUT/steps.json" 2>&1 | grep -v "it/s" > "$OUT/log.txt"
tail -40 "$OUT/log.txt"
