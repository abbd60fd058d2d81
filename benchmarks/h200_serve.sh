#!/usr/bin/env bash
# The serving figures of docs/benchmarks.md: `gearshift serve` driven by `gearshift bench serve`
# (prefix cache on and off, speculation on and off, a request-rate sweep) against the engine's
# closed loop, in one device call of at most 10 minutes on one H200. From the repository root:
#
#     OUT=out bash benchmarks/h200_serve.sh      # JSON, logs, server logs and PNGs under $OUT
#     python benchmarks/serve_report.py out      # -> the page's serving section + serve_rates.png
#
# H200_SMOKE=1 runs the same steps on the CPU at toy sizes with h200.sh's smoke pair:
# tests/unit/test_benchmarks_h200_serve.py runs it so this cannot rot. COMMIT, END and STEPS
# as in h200.sh; PORT (default 8011) is the server's port; TRACE_POINTS ("C:N ...": N prompts
# at concurrency C) the trace step's points.
#
#   step        what                                                                  cap
#   pair        the 8B-shaped bench pair, as h200.sh (skipped when $PAIR holds it)     80 s
#   engine      bench sweep, goodput vs off at c = 1, 4, 32, 128 in / 128 out, chains    220 s
#               as the server runs them, 8 requests a slot a pass: the closed-loop
#               reference for the server's gain
#   sampling    bench sweep of goodput at temperature 0.7 and 1.0, c = 1, 8, 64, with    150 s
#               each spec_sampling (coupled, rejection; chains): what coupling costs     each
#   prefix_off  serve without the prefix cache (start-up: ~40 s of graphs and       150 s up,
#               speculation warm-up), multi-turn chats (32 x 4 turns under one      60 + 45 s
#               1,024-word system prompt) at 2 requests/s, then all at once
#   prefix_on   the same with the prefix cache on; the server stays up for served
#   served      an untimed burst of 64 each way, then corpus prompts at c = 1, 4,   30 s each,
#               32 with and without speculation (30 s each, the modes taking turns  the rest
#               at going first), then the rate sweep 2..32/s (from 8/s 15 s of
#               arrivals a run, ~200 s in all) and all at once
#   trace       (its own call, STEPS="pair trace") a server with --step-trace at the      30 s each,
#               served points' concurrencies and 64 at once (speculating), then the        160 s
#               closed loop of goodput at the same c with --step-trace; trace_report.py
#               puts each c's served window beside its closed-loop passes in
#               $OUT/trace_cC.md (graphs captured / kernels compiled after the warm-up too)
# The steps take more than one call: STEPS="pair engine sampling" and then, on the still-warm
# machine (same lease), STEPS="pair prefix_off prefix_on served". SERVE_FLAGS adds flags to
# every server: SERVE_FLAGS=--no-engine-process STEPS="pair prefix_on served" measures the
# engine on a thread of the server instead of in a process of its own.
# Every server is killed on exit (trap) and leaves its log in $OUT/serve_{off,on}.log and its
# final /metrics in $OUT/serve_{off,on}_metrics.txt.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
STEPS=${STEPS:-pair engine sampling prefix_off prefix_on served}
: > "$OUT/steps.jsonl"

if [ "$SMOKE" = 1 ]; then
  smoke_pair
  # a free port, so that runs (tests) side by side do not meet
  PORT=${PORT:-$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0))
print(s.getsockname()[1])")}
  SERVER=(--max-num-seqs 8 --port "$PORT" --device cpu --kv-cache-tokens 8192)
  ENGINE=(--concurrency 1,2 --policies goodput,off --rounds 1 --passes 1 --min-requests 2
          --settle 0 --input-len 16 --output-len 8)
  MT=(--shared-prefix-len 32 --input-len 16 --output-len 8 --turns 2 --num-prompts 3
      --concurrency 3)
  LEN=(--input-len 16 --output-len 8)
  POINTS="1:2 2:4"  # concurrency:prompts, at the engine sweep's concurrencies
  TRACE_POINTS="$POINTS 4:4"
  WARMUP=1
  BURST=(--concurrency 4 --num-prompts 3)
  RATES=("${BURST[@]}" --sweep-rates 8,inf --sweep-seconds 0.5)
  SAMPLE=(--concurrency 1,2 --rounds 1 --passes 1 --min-requests 2 --settle 0 --input-len 16
          --output-len 8)
  LOOP=(--rounds 1 --passes 1 --min-requests 2 --settle 0)
else
  PORT=${PORT:-8011}
  SERVER=(--max-num-seqs 64 --port "$PORT")
  # 8 rounds: each pass gives a slot as many requests as the served points do from c = 4
  ENGINE=(--concurrency 1,4,32 --policies goodput,off --rounds 8 --passes 2 --min-requests 8
          --input-len 128 --output-len 128)
  MT=(--shared-prefix-len 1024 --input-len 128 --output-len 128 --turns 4 --num-prompts 32
      --concurrency 32)
  LEN=(--input-len 128 --output-len 128)
  # concurrency:prompts; at c = 1, eight read the gain unsteadily; from c = 4, 8 a slot, as
  # the engine step's passes: with 2, the window at c = 32 is mostly ramp and tail
  POINTS="1:16 4:32 32:256"
  TRACE_POINTS=${TRACE_POINTS:-"$POINTS 64:64"}  # and the rate sweep's all-at-once burst
  WARMUP=2
  # 64 a rate: with 32 the p99 is the slowest request alone; from 8/s, 15 s of arrivals
  # (120 to 480 requests), so that the p99 of a fast rate is not its slowest request
  BURST=(--concurrency 64 --num-prompts 64)
  RATES=("${BURST[@]}" --sweep-rates 2,4,8,16,32,inf --sweep-seconds 15)
  SAMPLE=(--concurrency 1,8,64 --rounds 2 --passes 2 --min-requests 8 --input-len 128
          --output-len 128)
  LOOP=(--rounds 8 --passes 2 --min-requests 8)  # as ENGINE: 8 requests a slot
fi
read -ra EXTRA <<< "${SERVE_FLAGS:-}"  # more `serve` flags, e.g. --no-engine-process
SERVER+=("${EXTRA[@]}")
URL=http://127.0.0.1:$PORT
BENCH=("${G[@]}" bench serve --base-url "$URL")
write_meta "$OUT/meta.json" port="$PORT"

SERVER_PID= SERVER_NAME=
stop_server() {  # SIGTERM, then SIGKILL after 20 s: a hung server must not hold the port
  [ -n "$SERVER_PID" ] || return 0
  # its metrics first: the one-off costs it met after the warm-up (late.*) go on the page
  python -c "import httpx, sys; open(sys.argv[2], 'w').write(httpx.get(sys.argv[1]).text)" \
    "$URL/metrics" "$OUT/${SERVER_NAME}_metrics.txt" 2>/dev/null
  kill "$SERVER_PID" 2>/dev/null
  for _ in $(seq 40); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
}
trap stop_server EXIT
trap 'exit 143' TERM INT  # through the EXIT trap

# start_server NAME CAP ARGS...: `gearshift serve` in the background, its log in $OUT/NAME.log,
# until GET /health answers 200; a server that dies or stays down CAP s fails the step
start_server() {
  local name=$1 cap t0=$SECONDS rc=1
  cap=$(cap_left "$2")
  shift 2
  local cmd=("${G[@]}" serve --model "$PAIR/target" --speculative-algorithm eagle3
             --draft-model "$PAIR/head" "${SERVER[@]}" "$@")
  echo "[$TAG] $(date -u +%T) $name: start (up within ${cap} s)"
  "${cmd[@]}" > "$OUT/$name.log" 2>&1 &
  SERVER_PID=$! SERVER_NAME=$name
  python - "$URL/health" "$cap" "$SERVER_PID" <<'PY' && rc=0
import os, sys, time
import httpx
url, cap, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
end = time.monotonic() + cap
while time.monotonic() < end:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)  # the server exited
    try:
        if httpx.get(url, timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
sys.exit(1)
PY
  note_step "$name" "$rc" "$((SECONDS - t0))" "$cap" "${cmd[@]}"
  if (( rc == 0 )); then
    echo "[$TAG] $name: up after $((SECONDS - t0)) s"
    return 0
  fi
  echo "[$TAG] $name: not up after $((SECONDS - t0)) s; its log ends:"
  tail -n 30 "$OUT/$name.log"
  FAILED=$((FAILED + 1))
  stop_server
  return 1
}

# multi_turn MODE: the multi-turn chats at 2 requests/s, then all at once
multi_turn() {
  step "mt_$1_r2" 60 "${BENCH[@]}" --workload multi-turn --dataset random-words "${MT[@]}" \
    --request-rate 2 --output-json "$OUT/mt_$1_r2.json"
  step "mt_$1_inf" 45 "${BENCH[@]}" --workload multi-turn --dataset random-words "${MT[@]}" \
    --output-json "$OUT/mt_$1_inf.json"
}

pair_step
cp "$PAIR/target/config.json" "$OUT/target_config.json" 2>/dev/null  # the model shape, for the report
# chains, as the server verifies them (it runs no --tree-width): the same speculation
run_step engine 220 "${G[@]}" bench sweep --model "$PAIR/target" --draft-model "$PAIR/head" \
  "${ENGINE[@]}" --tree-width 1 --output-json "$OUT/engine_sweep.json" --output-png "$OUT/engine_sweep.png"
if wanted sampling; then
  for t in 0.7 1.0; do
    for mode in coupled rejection; do
      step "samp_${t}_$mode" 150 "${G[@]}" bench sweep --model "$PAIR/target" \
        --draft-model "$PAIR/head" "${SAMPLE[@]}" --policies goodput --tree-width 1 \
        --temperature "$t" --spec-sampling "$mode" --output-json "$OUT/samp_${t}_$mode.json" \
        --output-png "$OUT/samp_${t}_$mode.png"
    done
  done
fi
if wanted prefix_off && start_server serve_off 150 --no-enable-prefix-caching; then
  multi_turn off
  stop_server
fi
if { wanted prefix_on || wanted served; } && start_server serve_on 150; then
  wanted prefix_on && multi_turn on
  if wanted served; then
    # what the server pays once (its first batch of a size) must not fall on one mode:
    # an untimed burst each way first, then the modes take turns at going first
    for mode in spec nospec; do
      flag=(); [ "$mode" = nospec ] && flag=(--no-speculative)
      step "warm_burst_$mode" 30 "${BENCH[@]}" --dataset corpus "${LEN[@]}" "${BURST[@]}" \
        --warmup 0 "${flag[@]}" --output-json "$OUT/warm_burst_$mode.json"
    done
    modes="spec nospec"
    for point in $POINTS; do
      c=${point%:*} n=${point#*:}
      for mode in $modes; do
        flag=(); [ "$mode" = nospec ] && flag=(--no-speculative)
        # both modes meet the same prompts uncached: the second would find the first's KV
        python -c "import httpx, sys; httpx.post(sys.argv[1]).raise_for_status()" \
          "$URL/reset_prefix_cache" || FAILED=$((FAILED + 1))
        step "srv_c${c}_$mode" 30 "${BENCH[@]}" --dataset corpus "${LEN[@]}" --concurrency "$c" \
          --num-prompts "$n" --warmup "$WARMUP" "${flag[@]}" --output-json "$OUT/srv_c${c}_$mode.json"
      done
      modes=$(echo "$modes" | awk '{print $2, $1}')
    done
    step rates $((END - SECONDS - 5)) "${BENCH[@]}" --dataset corpus "${LEN[@]}" "${RATES[@]}" \
      --compare-speculative --output-json "$OUT/rates.json" --output-png "$OUT/rates.png"
  fi
  stop_server
fi

if wanted trace && start_server serve_trace 150 --step-trace "$OUT/trace_served.jsonl"; then
  : > "$OUT/trace_windows.txt"
  for point in $TRACE_POINTS; do
    c=${point%:*} n=${point#*:}
    python -c "import httpx, sys; httpx.post(sys.argv[1]).raise_for_status()" \
      "$URL/reset_prefix_cache" || FAILED=$((FAILED + 1))
    step "trace_srv_c$c" 30 "${BENCH[@]}" --dataset corpus "${LEN[@]}" --concurrency "$c" \
      --num-prompts "$n" --warmup "$WARMUP" --output-json "$OUT/trace_srv_c$c.json"
    # the timed requests' span (not the warm-up's): the trace's steps of this run
    python -c "import json, sys; print(sys.argv[2], *json.load(open(sys.argv[1]))['window'])" \
      "$OUT/trace_srv_c$c.json" "$c" >> "$OUT/trace_windows.txt" || FAILED=$((FAILED + 1))
  done
  stop_server  # its exit writes the rest of the trace
  concs=$(for point in $TRACE_POINTS; do printf '%s,' "${point%:*}"; done)
  # chains, as the server runs them (no --tree-width)
  step trace_loop 160 "${G[@]}" bench sweep --model "$PAIR/target" --draft-model "$PAIR/head" \
    --policies goodput --tree-width 1 --concurrency "${concs%,}" "${LOOP[@]}" "${LEN[@]}" \
    --step-trace "$OUT/trace_loop.jsonl" --output-json "$OUT/trace_loop.json"
  python - "$OUT" <<'PY' || FAILED=$((FAILED + 1))
import contextlib, io, json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from trace_report import main
out = Path(sys.argv[1])
loop = {p["concurrency"]: p["windows"]
        for p in json.loads((out / "trace_loop.json").read_text())["results"]["goodput"]}
for line in (out / "trace_windows.txt").read_text().split("\n"):
    if not line.strip():
        continue
    c, t0, t1 = line.split()
    closed = ",".join(f"{a}:{b}" for a, b in loop[int(c)])
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        rc = main([f"{out}/trace_served.jsonl@{t0}:{t1}", f"{out}/trace_loop.jsonl@{closed}"])
    (out / f"trace_c{c}.md").write_text(f"c = {c}: served (left), closed loop (right)\n\n"
                                        + text.getvalue())
    print(f"[trace] c = {c}\n{text.getvalue()}")
    if rc:
        sys.exit(rc)
PY
fi

# a preview of the section from what came back (the page's: python benchmarks/serve_report.py OUT)
python benchmarks/serve_report.py "$OUT" --page "$OUT/benchmarks.md" || FAILED=$((FAILED + 1))
echo "[$TAG] done in $SECONDS s, $FAILED step(s) failed; section preview: $OUT/benchmarks.md"
(( FAILED == 0 ))
