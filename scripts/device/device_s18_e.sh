#!/usr/bin/env bash
# Session 18, call E: the session's final tree (logits in the model dtype, the sampler
# warmed for them, EXTEND steps routed to the fastest graph at or above their bucket, the
# chooser timing cuBLASLt) through the GPU tests of what changed, then batch 1 and offline
# (budget 512), with OLD_TREE (a `git archive` of 1f5bd5c, carried) between the two new
# offline runs for a same-lease comparison. The chooser's picks: bs1_new.json, tb_new.1.json.
# Usage (device tool, carry .cache/old_tree): OLD_TREE=.cache/old_tree bash scripts/device/device_s18_e.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 200 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  tests/kernels/test_sample_kernel.py tests/gpu/test_skinny_model.py tests/gpu/test_extend_graphs.py \
  tests/gpu/test_gpu_engine.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
source scripts/device/device_common.sh
OLD=$(realpath "$OLD_TREE")
bs1_run "new" new
offline_run "new" new.1
(cd "$OLD" && PYTHONPATH=$OLD offline_run "old" old.1)
offline_run "new" new.2
python -c "import json, sys; d = json.load(open(sys.argv[1])); print('extend route', {k: v for k, v in d['extend_route'].items() if int(k) != v})" "$OUT/tb_new.1.json" >> "$OUT/log.txt"
rm -f "$OUT"/tb_old.*.json "$OUT/tb_new.2.json"  # the device returns <= 8 files
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
