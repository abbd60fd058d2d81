#!/usr/bin/env bash
# Session 11, call F (the last ~280 s of device time): the two points closest to the line in
# the confirmation (calls D + E: c = 4 at 0.969 against the tree, c = 32 at 0.970) after
# the tree's gain became the paired ratio of accepted drafts and kept gears carry across
# counts of one padded batch. Goodput and the 3 closest policies, 6 passes, c = 4 first.
# Usage (device tool): bash scripts/device/device_s11_f.sh
CONC=${CONC:-4,32} PASSES=${PASSES:-6} END=${END:-215} exec bash "$(dirname "$0")/device_s11_d.sh"
