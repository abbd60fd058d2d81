# The step machinery shared by benchmarks/h200*.sh (sourced, not run). Sourcing it moves to
# the repository root, makes OUT absolute, puts this checkout first on PYTHONPATH and sets the
# defaults: END (seconds the whole call may take), SMOKE, G (the gearshift command), TAG (the
# log prefix: the script's name) and the bench pair (PAIR, PAIR_ARGS). The caller sets STEPS.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
END=${END:-580}
SMOKE=${H200_SMOKE:-0}
G=(python -m gearshift.cli)
TAG=$(basename "$0" .sh)
FAILED=0
if [ "$SMOKE" = 1 ]; then
  PAIR=${PAIR:-$OUT/pair}
else
  PAIR=${PAIR:-/tmp/gearshift_bench_pair}
fi
PAIR_ARGS=(--shape llama-3.1-8b --device cuda --head-draft-vocab 32000)  # smoke: its own

# H200_SMOKE's bench pair: the embedded default model (hidden 256, 8 layers) a little wider
SMOKE_SHAPE='{"hidden_size": 384, "num_attention_heads": 3, "num_key_value_heads": 1,
  "head_dim": 128, "intermediate_size": 768, "num_hidden_layers": 9}'

# smoke_pair: the smoke bench pair's shape in $OUT/smoke_shape.json (SHAPE) and PAIR_ARGS
smoke_pair() {
  SHAPE=$OUT/smoke_shape.json
  widen_default "$SHAPE" "$SMOKE_SHAPE"
  PAIR_ARGS=(--shape "$SHAPE" --device cpu)
}

# widen_default FILE JSON: the default model's config.json updated with JSON, into FILE
widen_default() {
  python - "$@" <<'PY'
import json, sys
from gearshift.models.default import default_target_dir
cfg = json.loads((default_target_dir() / "config.json").read_text())
cfg.update(json.loads(sys.argv[2]))
open(sys.argv[1], "w").write(json.dumps(cfg))
PY
}

# write_meta FILE [KEY=INT]...: commit, smoke flag, the GPU (nvidia-smi), $OUT and the start
write_meta() {
  python - "$OUT" "${H200_SMOKE:-0}" "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" \
    "$@" <<'PY'
import json, subprocess, sys
from datetime import UTC, datetime
out, smoke, commit, path, *extra = sys.argv[1:]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,power.limit,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=20).stdout.strip() or None
except (OSError, subprocess.SubprocessError):
    gpu = None
meta = {"commit": commit, "smoke": smoke == "1",
        **{k: int(v) for k, v in (e.split("=", 1) for e in extra)}, "gpu": gpu, "out": out,
        "started": datetime.now(UTC).isoformat(timespec="seconds")}
json.dump(meta, open(path, "w"), indent=1)
PY
}

# note_step NAME EXIT SECONDS CAP CMD...: one JSON line in steps.jsonl with the exact command
note_step() {
  python - "$@" >> "$OUT/steps.jsonl" <<'PY'
import json, shlex, sys
name, rc, seconds, cap, *cmd = sys.argv[1:]
print(json.dumps({"step": name, "exit": int(rc), "seconds": int(seconds), "timeout_s": int(cap),
                  "command": shlex.join(cmd)}))
PY
}

wanted() { [[ " $STEPS " == *" $1 "* ]]; }

# cap_left CAP: CAP, or what is left before END when that is less
cap_left() { local cap=$1; (( cap > END - SECONDS )) && cap=$((END - SECONDS)); echo "$cap"; }

# step NAME CAP CMD...: runs CMD under `timeout` (cap_left CAP), its output in $OUT/NAME.log,
# and prints the log's last lines (the bench's table)
step() {
  local name=$1 cap rc t0=$SECONDS
  cap=$(cap_left "$2")
  shift 2
  if (( cap < 5 )); then
    rc=124
    echo "[$TAG] $name: no time left, skipped"
  else
    echo "[$TAG] $(date -u +%T) $name: start (timeout ${cap} s)"
    timeout -k 10 "$cap" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    tr '\r' '\n' < "$OUT/$name.log" | grep -v "it/s\]\|s/it\]\|req/s\]\|^$" | tail -n 14
    echo "[$TAG] $name: exit $rc after $((SECONDS - t0)) s"
  fi
  note_step "$name" "$rc" "$((SECONDS - t0))" "$cap" "$@"
  (( rc == 0 )) || FAILED=$((FAILED + 1))
}

run_step() { wanted "$1" || return 0; step "$@"; }  # NAME CAP CMD...: step, if in STEPS

# pair_step: the bench target and its EAGLE-3 head in $PAIR, skipped when already there
pair_step() {
  local cmd=("${G[@]}" make-bench-model "${PAIR_ARGS[@]}" --out "$PAIR/target"
             --head gearshift/default_model/eagle3 --head-out "$PAIR/head")
  if wanted pair && [ -f "$PAIR/target/config.json" ] && [ -f "$PAIR/head/config.json" ]; then
    echo "[$TAG] pair: $PAIR already holds the bench pair"  # a warm machine that ran this before
    note_step pair 0 0 0 "${cmd[@]}"
  else
    run_step pair 80 "${cmd[@]}"
  fi
}
