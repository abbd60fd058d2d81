#!/usr/bin/env bash
# Session 11, call C: why goodput ran 166 chain steps beside 444 tree steps at c = 1 with no
# gear switch (call A). Every step of goodput, always-4 and the tree at c = 1, 2, 4, 8, with
# goodput's running gear and the reason for each plan's gear (scripts/diag_goodput_steps.py).
# Usage (device tool): bash scripts/device/device_s11_c.sh
POLICIES=${POLICIES:-goodput,always-4,tree} CONC=${CONC:-1,2,4,8} PASSES=${PASSES:-3} \
  END=${END:-330} exec bash "$(dirname "$0")/device_s10_e.sh"
