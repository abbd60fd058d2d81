#!/usr/bin/env bash
# The CPU figures of goodput on the embedded default model (docs/benchmarks.md, "Goodput on
# the CPU"): the policies against each other at batch 1 and 4 on code prompts, then the
# transition workload (code, random words, code); then the hybrid proposer (eagle3+suffix)
# against each proposer alone on the agentic, novel and mixed-agentic workloads. Run on a
# quiet machine (the figures are wall times), from the repository root:
#
#     OUT=cpu bash benchmarks/cpu.sh           # JSON, PNG and logs under $OUT (~7 minutes)
#     python benchmarks/cpu_report.py cpu      # -> the section, printed (paste it in place)
#     python benchmarks/hybrid_report.py cpu   # -> the hybrid's CPU section, likewise
#
# The sweeps run every policy interleaved, two passes in alternating order on the same
# prompts; cpu_report.py takes each policy's better pass (best of 2). The engine is the
# README's: the embedded model, its EAGLE-3 head, chains up to K = 4 (--tree-width 1: no tree).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
COMMON=(--concurrency 1,4 --rounds 1 --min-requests 8 --passes 2 --settle 1 --input-len 128
        --output-len 128 --tree-width 1 --policies goodput,off,always-2,always-4)
python - "$OUT/meta.json" <<'PY'
import json, platform, subprocess, sys
from datetime import UTC, datetime
import torch
try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = "unknown"
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
            if line.startswith("model name")), platform.processor())
json.dump({"commit": commit or "unknown", "cpu": cpu, "torch": torch.__version__,
           "started": datetime.now(UTC).isoformat(timespec="seconds")}, open(sys.argv[1], "w"))
PY
FAILED=0
for run in uniform transition; do
  echo "[cpu] $(date -u +%T) $run: start"
  python -m gearshift.cli bench sweep "${COMMON[@]}" --workload "$run" \
    --output-json "$OUT/$run.json" --output-png "$OUT/$run.png" > "$OUT/$run.log" 2>&1 \
    || FAILED=$((FAILED + 1))
  tr '\r' '\n' < "$OUT/$run.log" | grep "^|" | tail -n 8
done
# the hybrid (eagle3+suffix) against each proposer alone: python benchmarks/hybrid_report.py
HYBRID=(--speculative-algorithm eagle3+suffix --rounds 2 --min-requests 16 --passes 2
        --output-len 64 --tree-width 1 --policies hybrid,model-only,suffix-only)
for run in agentic:agentic:1,8 novel:uniform:1,8 mixed_agentic:mixed-agentic:8; do
  IFS=: read -r name workload cs <<< "$run"
  echo "[cpu] $(date -u +%T) $name: start"
  python -m gearshift.cli bench sweep "${HYBRID[@]}" --workload "$workload" --concurrency "$cs" \
    --output-json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 || FAILED=$((FAILED + 1))
  tr '\r' '\n' < "$OUT/$name.log" | grep "^c=" | tail -n 3
done
echo "[cpu] done, $FAILED run(s) failed"
exit "$FAILED"
