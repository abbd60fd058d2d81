#!/usr/bin/env bash
# Session 18, call F: decode attention at one split over more than ~2 waves (batch 33-64)
# with 2 warps a program instead of 4 (decode_blocks), against the tree before
# (OLD_TREE: `git archive` of the parent commit, carried): the GPU decode-kernel tests,
# then offline (budget 512) new, old, new.
# Usage (device tool, carry .cache/old_tree): OLD_TREE=.cache/old_tree bash scripts/device/device_s18_f.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 60 python -m pytest -q -p no:cacheprovider tests/kernels/test_decode_kernel.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -2 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
source scripts/device/device_common.sh
OLD=$(realpath "$OLD_TREE")
offline_run "new" new.1
(cd "$OLD" && PYTHONPATH=$OLD offline_run "old" old.1)
offline_run "new" new.2
rm -f "$OUT"/tb_old.*.json "$OUT/tb_new.2.json"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
