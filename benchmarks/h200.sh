#!/usr/bin/env bash
# Every headline figure of docs/benchmarks.md, measured on the current commit in ONE device
# call of at most 10 minutes on one H200. From the repository root:
#
#     OUT=out bash benchmarks/h200.sh        # JSON, logs and the sweep's PNG under $OUT
#     python benchmarks/report.py out        # -> docs/benchmarks.md + docs/spec_sweep.png
#
# H200_SMOKE=1 runs the same steps on the CPU at toy sizes (a widened copy of the embedded
# default model, a few tokens): tests/unit/test_benchmarks_h200.py runs it so this cannot rot.
# COMMIT=<hash> names the commit where the device's copy of the tree has no .git.
#
# Steps, each with its own timeout (cap), none past END (580 s; a step that ignores its
# SIGTERM is killed 10 s later) so the call ends within its 10 minutes.
# Estimates come from earlier H200 runs of the same commands:
#   step          what                                                      estimate  cap
#   pair          make-bench-model: the 8B-shaped bench target (16 GB on       45 s   80 s
#                 /tmp) and its EAGLE-3 head; skipped when $PAIR holds them
#   decode_plain  decode step at batch 1, 32, 128 (1k context, 128 output;     85 s  130 s
#                 llama-3.1-8b preset, dummy bf16 weights, no draft): the
#                 first engine of the call, so Triton compiles and the GEMM
#                 chooser's timings land here (~60 s start-up), ~8 s of steps
#   decode_draft  the same with the bench head configured at spec_policy off   40 s   80 s
#                 (warm compile cache; no speculation warm-up at policy off)
#   offline       256 prompts x 512 in / 256 out, <= 64 running, step budget   30 s   70 s
#                 512: ~10 s start-up, ~9 s timed run
#   sweep         7 policies at c = 1, 8, 64, 256, 2 rounds x 2 passes        240 s  the rest
#                 (>= 8 requests a point): ~75 s start-up (load 16 GB, graphs,   (>= 220 s)
#                 speculation warm-up at 256 sequences), ~10 s settling at
#                 c = 1, ~35 s of untimed warm-ups before the points, ~125 s timed
#   total                                                                   ~440 s  580 s
# The sweep saves after each concurrency, so a cut sweep keeps its first points.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
END=${END:-580}
SMOKE=${H200_SMOKE:-0}
G=(python -m gearshift.cli)
: > "$OUT/steps.jsonl"

if [ "$SMOKE" = 1 ]; then
  PAIR=${PAIR:-$OUT/pair}
  SHAPE=$OUT/smoke_shape.json  # the default model (hidden 256, 8 layers) a little wider
  python - "$SHAPE" <<'PY'
import json, sys
from gearshift.models.default import default_target_dir
cfg = json.loads((default_target_dir() / "config.json").read_text())
cfg.update(hidden_size=384, num_attention_heads=3, num_key_value_heads=1, head_dim=128,
           intermediate_size=768, num_hidden_layers=9)
open(sys.argv[1], "w").write(json.dumps(cfg))
PY
  PAIR_ARGS=(--shape "$SHAPE" --device cpu)
  MODEL=(--preset "$SHAPE" --load-format dummy)
  DECODE=(--batch-sizes 1,2,4 --input-len 16 --output-len 8)
  OFFLINE=(--max-num-seqs 4 --num-prompts 6 --input-len 16 --output-len 8 --max-num-batched-tokens 32)
  SWEEP=(--concurrency 1,2 --rounds 1 --passes 2 --min-requests 2 --settle 0 --input-len 8
         --output-len 6 --tree-topk 2 --tree-tokens 4)
else
  PAIR=${PAIR:-/tmp/gearshift_bench_pair}
  PAIR_ARGS=(--shape llama-3.1-8b --device cuda --head-draft-vocab 32000)
  MODEL=(--preset llama-3.1-8b --load-format dummy)
  DECODE=(--batch-sizes 1,32,128 --input-len 1024 --output-len 128)
  OFFLINE=(--max-num-seqs 64 --num-prompts 256 --input-len 512 --output-len 256
           --max-num-batched-tokens 512)
  SWEEP=(--concurrency 1,8,64,256 --rounds 2 --passes 2 --min-requests 8)
fi

python - "$OUT" "$SMOKE" "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" <<'PY'
import json, subprocess, sys
from datetime import UTC, datetime
out, smoke, commit = sys.argv[1:]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,power.limit,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=20).stdout.strip() or None
except (OSError, subprocess.SubprocessError):
    gpu = None
json.dump({"commit": commit, "smoke": smoke == "1", "gpu": gpu, "out": out,
           "started": datetime.now(UTC).isoformat(timespec="seconds")},
          open(f"{out}/meta.json", "w"), indent=1)
PY

FAILED=0
# note_step NAME EXIT SECONDS CAP CMD...: one JSON line in steps.jsonl with the exact command
note_step() {
  python - "$@" >> "$OUT/steps.jsonl" <<'PY'
import json, shlex, sys
name, rc, seconds, cap, *cmd = sys.argv[1:]
print(json.dumps({"step": name, "exit": int(rc), "seconds": int(seconds), "timeout_s": int(cap),
                  "command": shlex.join(cmd)}))
PY
}

# run_step NAME CAP CMD...: runs CMD under `timeout` (CAP, or what is left before END), its
# output in $OUT/NAME.log, and prints the log's last lines (the bench's table)
run_step() {
  local name=$1 cap=$2 rc t0=$SECONDS
  shift 2
  (( cap > END - SECONDS )) && cap=$((END - SECONDS))
  if (( cap < 5 )); then
    rc=124
    echo "[h200] $name: no time left, skipped"
  else
    echo "[h200] $(date -u +%T) $name: start (timeout ${cap} s)"
    timeout -k 10 "$cap" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    tr '\r' '\n' < "$OUT/$name.log" | grep -v "it/s\]\|s/it\]\|^$" | tail -n 14
    echo "[h200] $name: exit $rc after $((SECONDS - t0)) s"
  fi
  note_step "$name" "$rc" "$((SECONDS - t0))" "$cap" "$@"
  (( rc == 0 )) || FAILED=$((FAILED + 1))
}

PAIR_CMD=("${G[@]}" make-bench-model "${PAIR_ARGS[@]}" --out "$PAIR/target"
          --head gearshift/default_model/eagle3 --head-out "$PAIR/head")
if [ -f "$PAIR/target/config.json" ] && [ -f "$PAIR/head/config.json" ]; then
  echo "[h200] pair: $PAIR already holds the bench pair"  # a warm machine that ran this before
  note_step pair 0 0 0 "${PAIR_CMD[@]}"
else
  run_step pair 80 "${PAIR_CMD[@]}"
fi
run_step decode_plain 130 "${G[@]}" bench offline "${MODEL[@]}" "${DECODE[@]}" \
  --output-json "$OUT/decode_plain.json"
run_step decode_draft 80 "${G[@]}" bench offline "${MODEL[@]}" "${DECODE[@]}" \
  --speculative-algorithm eagle3 --draft-model "$PAIR/head" --spec-policy off \
  --output-json "$OUT/decode_draft.json"
run_step offline 70 "${G[@]}" bench offline "${MODEL[@]}" "${OFFLINE[@]}" \
  --output-json "$OUT/offline.json"
run_step sweep $((END - SECONDS)) "${G[@]}" bench sweep --model "$PAIR/target" \
  --draft-model "$PAIR/head" "${SWEEP[@]}" \
  --output-json "$OUT/sweep.json" --output-png "$OUT/sweep.png"

# a preview of the page from what came back (the real one: python benchmarks/report.py OUT)
python benchmarks/report.py "$OUT" --output "$OUT/benchmarks.md" || FAILED=$((FAILED + 1))
echo "[h200] done in $SECONDS s, $FAILED step(s) failed; page preview: $OUT/benchmarks.md"
(( FAILED == 0 ))
