#!/usr/bin/env bash
# Ran at commit b1c4451; the experiment's scripts and kernel code were removed after it.
# Session 20, call B: (1) cuBLASLt's wider heuristic list against torch's cuBLAS pick on the
# 8B layer products at 512 and 64 rows (scripts/probe_cublaslt_algos.py); (2) a graphed
# profile of ten 512-token mixed steps on today's code (where the mixed step's time goes).
# Usage (device tool): bash scripts/device/device_s20_b.sh
set -uo pipefail
OUT=$(realpath "${OUT:-out}"); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u +%FT%TZ > "$OUT/log.txt"
timeout 240 python scripts/probe_cublaslt_algos.py --rows 512 64 --count 64 \
  --out "$OUT/cublaslt_algos.json" >> "$OUT/log.txt" 2>&1 || echo "probe rc $?" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
timeout 150 python -m gearshift.cli bench offline --preset llama-3.1-8b --load-format dummy \
  --max-num-seqs 64 --num-prompts 256 --input-len 512 --output-len 256 --max-num-batched-tokens 512 \
  --profile-steps 262 10 --profile-out "$OUT/prof_mixed512.txt" --output-json "$OUT/prof_run.json" \
  > "$OUT/prof_run.log" 2>&1 || tail -5 "$OUT/prof_run.log" >> "$OUT/log.txt"
head -45 "$OUT/prof_mixed512.txt" >> "$OUT/log.txt"
date -u +%FT%TZ >> "$OUT/log.txt"
cat "$OUT/log.txt"
