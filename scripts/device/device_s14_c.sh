#!/usr/bin/env bash
# Session 14, call C: the gated gate_up (SiLU fused) with the chooser timing its candidates
# in interleaved rounds. GPU tests of the skinny kernel and chooser; decode at batch 1 / 1k
# context three times on this tree (with the chooser's qkv choice each time) and once on
# OLD_TREE (run from inside it: `python -m` puts the working directory first on sys.path);
# offline throughput (256 prompts, 512 in / 256 out, <= 64 running, budget 512), two
# passes, with the one-off costs inside each run (Triton compiles, newly timed shapes).
# Usage (device tool, carry old_tree): OLD_TREE=old_tree bash scripts/device/device_s14_c.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
date -u +%FT%TZ > "$OUT/log.txt"
PYTHONPATH=$PWD timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  tests/gpu/test_skinny_model.py > "$OUT/gpu_tests.log" 2>&1
echo "skinny tests rc $?" >> "$OUT/log.txt"; tail -1 "$OUT/gpu_tests.log" >> "$OUT/log.txt"
bs1() {  # $1: tree, $2: json
  (cd "$1" && PYTHONPATH=$1 timeout 120 python -m gearshift.cli bench offline --preset llama-3.1-8b \
    --load-format dummy --max-num-seqs 64 --num-prompts 1 --input-len 1024 --output-len 128 \
    --output-json "$2" 2>&1 | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt")
  python -c "import json,sys; d=json.load(open(sys.argv[1])); print('  qkv/o at 1 row:', [(r['n'], r['choice'], {k: round(v * 1e3, 1) for k, v in r['ms'].items()}) for r in d.get('skinny_gemm', {}).get('shapes', []) if r['rows'] == 1 and r['n'] in (6144, 4096) and r['k'] == 4096])" "$2" >> "$OUT/log.txt"
}
for i in 1 2 3; do echo "this tree bs1 #$i:" >> "$OUT/log.txt"; bs1 "$PWD" "$OUT/bs1_new_$i.json"; done
echo "this tree offline:" >> "$OUT/log.txt"
PYTHONPATH=$PWD timeout 200 python scripts/exp_token_budget.py --budgets 512 \
  --passes 2 --out "$OUT/token_budget.json" 2>&1 | grep "^budget" >> "$OUT/log.txt"
if [ -n "${OLD_TREE:-}" ]; then
  echo "old tree bs1:" >> "$OUT/log.txt"; bs1 "$PWD/$OLD_TREE" "$OUT/bs1_old.json"
fi
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
