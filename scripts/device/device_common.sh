# Sourced by the device scripts (scripts/device/device_s17_d.sh, device_s18_a.sh): issue 2's two
# runs on the llama-3.1-8b preset (dummy bf16), each appending its figures to $OUT/log.txt.
# Environment set on the call (VAR=value bs1_run ...) reaches the run.

BS1=(bench offline --preset llama-3.1-8b --load-format dummy --max-num-seqs 64 --num-prompts 1
     --input-len 1024 --output-len 128)

# bs1_run LABEL TAG: batch-1 decode at 1k context; the step medians into the log
bs1_run() {
  echo "$1 bs1:" >> "$OUT/log.txt"
  timeout 100 python -m gearshift.cli "${BS1[@]}" --output-json "$OUT/bs1_$2.json" 2>&1 \
    | grep -E "decode_step_ms_median |decode_device" >> "$OUT/log.txt"
}

# offline_run LABEL TAG: the offline workload at step budget 512 (scripts/exp_token_budget.py:
# tok/s, steps, the chooser's picks in its JSON); its summary line into the log
offline_run() {
  echo "$1 offline:" >> "$OUT/log.txt"
  local log="$OUT/run.log"  # one log for every run (the device returns few files)
  echo "== $1 ($2)" >> "$log"
  timeout 110 python scripts/exp_token_budget.py --budgets 512 --passes 1 \
    --out "$OUT/tb_$2.json" > "$log.part" 2>&1
  grep "^budget" "$log.part" >> "$OUT/log.txt" || tail -5 "$log.part" >> "$OUT/log.txt"
  cat "$log.part" >> "$log"; rm -f "$log.part"
}
