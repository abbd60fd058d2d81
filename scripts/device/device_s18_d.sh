#!/usr/bin/env bash
# Session 18, call D: logits in the model dtype for the sampler (this tree) against the
# tree before it (OLD_TREE, a `git archive` of 1f5bd5c, carried): the GPU sampler and
# engine tests, torch's two BLAS back ends on the 8B GEMMs (scripts/bench_blas_library.py),
# then batch 1 and offline (budget 512) on each tree, alternating.
# The old tree's runs start in its directory (python -m puts the working directory first
# on sys.path).
# Usage (device tool, carry .cache/old_tree): OLD_TREE=.cache/old_tree bash scripts/device/device_s18_d.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_sample_kernel.py \
  tests/gpu/test_gpu_engine.py tests/gpu/test_extend_graphs.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/log.txt"; tail -3 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
timeout 90 python scripts/bench_blas_library.py --out "$OUT/blas_library.json" > "$OUT/blas.log" 2>&1
grep "layer GEMMs" "$OUT/blas.log" >> "$OUT/log.txt"
source scripts/device/device_common.sh
OLD=$(realpath "$OLD_TREE")
bs1_run "new" new
(cd "$OLD" && PYTHONPATH=$OLD bs1_run "old" old)
offline_run "new" new.1
(cd "$OLD" && PYTHONPATH=$OLD offline_run "old" old.1)
offline_run "new" new.2
(cd "$OLD" && PYTHONPATH=$OLD offline_run "old" old.2)
rm -f "$OUT"/tb_old.*.json "$OUT/tb_new.2.json" "$OUT/bs1_old.json"  # the device returns <= 8 files
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
