#!/usr/bin/env bash
# Session 19, call D: the extend kernel's decoder path in one masked loop (ONE_LOOP) against
# the two loops before it (OLD_TREE: git archive of the parent). GPU extend-kernel tests;
# bench_extend_attn (the classes' configs) new / old on the mixed step and its two parts;
# offline new / old / new.
# Usage (device tool): OLD_TREE=.cache/old_tree bash scripts/device/device_s19_d.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
OLD=$(realpath "$OLD_TREE")
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
source scripts/device/device_common.sh
date -u +%FT%TZ > "$OUT/log.txt"
timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels/test_extend_kernel.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -1 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
CASES="mixed512_graph dec60_graph chunk452_graph mixed_graph"
timeout 150 python scripts/bench_extend_attn.py --classes-only --cases $CASES --out "$OUT/extend_new.json" \
  2>&1 | grep -E "default" | sed 's/^/new /' >> "$OUT/log.txt"
NEW=$PWD
(cd "$OLD" && PYTHONPATH=$OLD timeout 150 python "$NEW/scripts/bench_extend_attn.py" --classes-only --cases $CASES \
  --out "$OUT/extend_old.json" 2>&1 | grep -E "default" | sed 's/^/old /' >> "$OUT/log.txt")
offline_run "new 1" new1
(cd "$OLD" && PYTHONPATH=$OLD offline_run "old 1" old1)
offline_run "new 2" new2
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
