#!/usr/bin/env bash
# The tensor-parallel figures of docs/benchmarks.md, on a machine with TP (default 2) H200s.
# From the repository root:
#
#     OUT=out bash benchmarks/h200_tp.sh            # every step; JSON and logs under $OUT
#     python benchmarks/tp_report.py out            # -> the page's tensor-parallel section
#
# Two device calls of at most 10 minutes hold it all (END bounds one call; STEPS picks steps):
#     STEPS="pair decode_tp1 decode_tp offline_tp load_70b" OUT=out bash benchmarks/h200_tp.sh
#     STEPS="sweep_tp greedy_tp fault_tp" OUT=out bash benchmarks/h200_tp.sh
#
# TP=1 runs it on one GPU through the distributed code path: the TP steps start under
# `torchrun --nproc-per-node 1` (NCCL with one rank), the 70B step loads a 70B-wide model of
# 8 of its 80 layers (one H200 cannot hold 141 GB), and the fault step is skipped.
# H200_SMOKE=1 runs the steps on the CPU at toy sizes (gloo, TP=2): tests/unit/
# test_benchmarks_h200_tp.py runs it so this cannot rot. COMMIT=<hash> names the commit
# where the device's copy of the tree has no .git. The step machinery: benchmarks/steps.sh.
#
#   step        what                                                             cap
#   pair        make-bench-model: the 8B-shaped bench target and its EAGLE-3 head  80 s
#               (as benchmarks/h200.sh; skipped when $PAIR holds them)
#   decode_tp1  decode step at batch 1 and 64 (1k context, 128 output), llama-3.1-8b 130 s
#               preset, dummy bf16, one GPU, no process group: the reference
#   decode_tp   the same at TP ranks                                              130 s
#   offline_tp  256 prompts x 512 in / 256 out, <= 64 running, at TP ranks         100 s
#   load_70b    llama-3.1-70b preset, dummy bf16 (70.6 GB a rank at TP=2): load,   200 s
#               decode step at batch 1 and 64 (1k context)
#   sweep_tp    the policy sweep of h200.sh (c = 1, 8, 64, 256) at TP ranks        the rest
#   greedy_tp   goodput's greedy outputs == plain decoding's on one engine, fp32    150 s
#               (64 prompts together, 8 one at a time), at TP ranks
#   fault_tp    `serve -tp TP` under 16 streamed requests, rank TP-1 killed: the      90 s
#               server must exit non-zero within seconds, every stream end
# Caps are guesses (no step has run on two GPUs yet): the first run should note the times.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
# NVLink multicast stays off on the lent machines (it can take the host's GPUs down)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TP=${TP:-2}
STEPS=${STEPS:-pair decode_tp1 decode_tp offline_tp load_70b sweep_tp greedy_tp fault_tp}
if [ "$TP" = 1 ]; then
  GT=(torchrun --standalone --nproc-per-node 1 -m gearshift.cli)
  PT=(torchrun --standalone --nproc-per-node 1)
else
  GT=("${G[@]}")
  PT=(python)
fi
TPF=(--tensor-parallel-size "$TP")
touch "$OUT/steps.jsonl"

if [ "$SMOKE" = 1 ]; then
  SHAPE=$OUT/smoke_shape.json  # the default model widened to 4 heads: splits over 2 ranks
  BIG=$OUT/smoke_big.json      # 70B's layout in miniature: 8 heads, 8 KV heads
  widen_default "$SHAPE" '{"hidden_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 1024, "num_hidden_layers": 8}'
  widen_default "$BIG" '{"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
    "head_dim": 64, "intermediate_size": 1792, "num_hidden_layers": 2, "tie_word_embeddings": false}'
  PAIR_ARGS=(--shape "$SHAPE" --device cpu)
  MODEL=(--preset "$SHAPE" --load-format dummy)
  BIG_MODEL=(--preset "$BIG" --load-format dummy)
  DECODE=(--batch-sizes 1,2 --input-len 16 --output-len 8)
  OFFLINE=(--max-num-seqs 4 --num-prompts 6 --input-len 16 --output-len 8 --max-num-batched-tokens 32)
  SWEEP=(--concurrency 1,2 --rounds 1 --passes 2 --min-requests 2 --settle 0 --input-len 8
         --output-len 6 --tree-width 2 --tree-budget 4 --policies goodput,off,always-2)
  GREEDY=(--device cpu --num-prompts 4 --solo 2 --input-len 8 --output-len 8)
  FAULT=(--requests 4 --kill-after 1 --max-tokens 1900 -- "$PAIR/target" --device cpu
         --kv-cache-tokens 8192 --max-num-seqs 4)
else
  MODEL=(--preset llama-3.1-8b --load-format dummy)
  BIG_MODEL=(--preset llama-3.1-70b --load-format dummy)
  if [ "$TP" = 1 ]; then
    python - "$OUT/llama70b_8layers.json" <<'PY'
import json, sys
from gearshift.models.loader import PRESETS_DIR
cfg = json.loads((PRESETS_DIR / "llama-3.1-70b.json").read_text())
cfg["num_hidden_layers"] = 8
open(sys.argv[1], "w").write(json.dumps(cfg))
PY
    BIG_MODEL=(--preset "$OUT/llama70b_8layers.json" --load-format dummy)
  fi
  DECODE=(--batch-sizes 1,64 --input-len 1024 --output-len 128)
  OFFLINE=(--max-num-seqs 64 --num-prompts 256 --input-len 512 --output-len 256
           --max-num-batched-tokens 512)
  SWEEP=(--concurrency 1,8,64,256 --rounds 2 --passes 2 --min-requests 8)
  GREEDY=(--device cuda)
  FAULT=(-- "$PAIR/target" --device cuda)
fi

write_meta "$OUT/meta_tp.json" tensor_parallel_size="$TP"

pair_step
run_step decode_tp1 130 "${G[@]}" bench offline "${MODEL[@]}" "${DECODE[@]}" \
  --output-json "$OUT/decode_tp1.json"
run_step decode_tp 130 "${GT[@]}" bench offline "${MODEL[@]}" "${DECODE[@]}" "${TPF[@]}" \
  --output-json "$OUT/decode_tp.json"
run_step offline_tp 100 "${GT[@]}" bench offline "${MODEL[@]}" "${OFFLINE[@]}" "${TPF[@]}" \
  --output-json "$OUT/offline_tp.json"
run_step load_70b 200 "${GT[@]}" bench offline "${BIG_MODEL[@]}" "${DECODE[@]}" "${TPF[@]}" \
  --output-json "$OUT/load_70b.json"
# the greedy and fault checks keep their time: the sweep takes what is left before them
wanted greedy_tp && RESERVE=150 || RESERVE=0
wanted fault_tp && (( TP > 1 )) && RESERVE=$((RESERVE + 90))
run_step sweep_tp $((END - SECONDS - RESERVE)) "${GT[@]}" bench sweep --model "$PAIR/target" \
  --draft-model "$PAIR/head" "${SWEEP[@]}" "${TPF[@]}" \
  --output-json "$OUT/sweep_tp.json" --output-png "$OUT/sweep_tp.png"
run_step greedy_tp 150 "${PT[@]}" benchmarks/tp_checks.py greedy --model "$PAIR/target" \
  --draft-model "$PAIR/head" --tp "$TP" "${GREEDY[@]}" --out "$OUT/greedy_tp.json"
if (( TP > 1 )); then
  run_step fault_tp 90 python benchmarks/tp_checks.py fault --tp "$TP" --out "$OUT/fault_tp.json" \
    "${FAULT[@]}"
elif wanted fault_tp; then
  echo "[h200_tp] fault_tp: skipped at TP=1 (no other rank to kill)"
fi

python benchmarks/tp_report.py "$OUT" > "$OUT/tp_section.md" || FAILED=$((FAILED + 1))
echo "[h200_tp] done in $SECONDS s, $FAILED step(s) failed; section preview: $OUT/tp_section.md"
(( FAILED == 0 ))
