#!/usr/bin/env bash
# Session 9, calls C and D: the full sweep (every policy) at real concurrency, in two halves.
# Until session 9 a pass ran c * rounds / passes requests: the focus runs (5 rounds, 8
# passes) never had more than 5c/8 requests running. Now a pass runs c * ROUNDS requests.
# Usage (device tool): CONC=32,64,128,256 ROUNDS=3 PASSES=2 bash scripts/device/device_s9_c.sh
#                      CONC=1,2,4,8,16 ROUNDS=3 PASSES=4 bash scripts/device/device_s9_c.sh
SWEEP_ARGS="--rounds ${ROUNDS:-3} --passes ${PASSES:-2} --concurrency ${CONC:-32,64,128,256}" \
  exec bash "$(dirname "$0")/device_s6_b.sh"
