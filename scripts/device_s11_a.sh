#!/usr/bin/env bash
# Prepared in session 10 for the next session (not yet run): where goodput's ~0.1 ms per
# VERIFY step at c = 8 goes (session 10, calls D and E). At c = 8, every step recorded:
#   always-4; goodput; goodput-shadow (goodput's host work, K = 4 always);
#   always-4-spin-100 / -300: always-4 with a busy wait of 100 / 300 us in the prepare window.
# Spin steps costing what always-4's do: the window is idle host time, and the shadow's
# extra time is what its work does to the host, not how long it takes. Spin steps 0.1 / 0.3 ms
# slower: the window is on the critical path. Usage (device tool): bash scripts/device_s11_a.sh
POLICIES=always-4,goodput,goodput-shadow,always-4-spin-100,always-4-spin-300 \
  PASSES=${PASSES:-8} END=560 exec bash "$(dirname "$0")/device_s10_e.sh"
