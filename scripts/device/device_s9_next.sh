#!/usr/bin/env bash
# Prepared in session 8 for the next session's first call (not yet run): GPU tests of the
# final session-8 code (the warm-up test also runs the cost model's catch-up prior), then
# goodput vs the tree policy vs always-4 at c = 1 in alternating order over 3 rounds
# (is goodput's ~0.3 ms slower host work per tree step real, or its place in the run?),
# then the focus sweep c = 1..16. The second call: CONC=32,64,128,256 bash scripts/device/device_focus.sh
# Usage (device tool): bash scripts/device/device_s9_next.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
G="python -m gearshift.cli"
date -u +%FT%TZ > "$OUT/tests_log.txt"
timeout 220 python -m pytest -q -p no:cacheprovider tests/gpu/test_random_soak.py \
  tests/gpu/test_gpu_engine.py tests/gpu/test_extend_graphs.py tests/e2e/test_spec_trap.py \
  2>&1 | tail -25 > "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt" >> "$OUT/tests_log.txt"
timeout 90 $G make-bench-model --shape llama-3.1-8b --out /tmp/big --device cuda \
  --head gearshift/default_model/eagle3 --head-out /tmp/bighead --head-draft-vocab 32000 \
  > "$OUT/make_bench.txt" 2>&1; tail -1 "$OUT/make_bench.txt" >> "$OUT/tests_log.txt"
timeout 120 python scripts/diag_verify_host.py --model /tmp/big --draft-model /tmp/bighead \
  --points goodput:1,tree:1,always-4:1 --steps 100 --rounds 3 \
  --out "$OUT/diag_verify_host.json" 2>&1 | grep -v "Token indices" | cut -c1-200 >> "$OUT/tests_log.txt"
echo "diag done at ${SECONDS} s" >> "$OUT/tests_log.txt"
cat "$OUT/tests_log.txt"
END=$((585 - SECONDS)) CONC=${CONC:-1,2,4,8,16} PASSES=${PASSES:-8} bash scripts/device/device_focus.sh
