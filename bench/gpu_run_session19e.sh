#!/usr/bin/env bash
# Nineteenth session, fifth call (~1 min): the one-row W4A16 default now splits K below 2 waves of SMs (the fourth
# call timed 4096 x 12288 unsplit at 33.8 us: 256 programs); the default on both shapes again, and the one-row
# kernel's K splits on 4096 x 12288.
set -uo pipefail
source bench/gpu_env.sh
step "W4A16 one row: the default, K splits"
timeout 150 python3 bench/quant_decode_sweep.py --sections w4def --out "$OUT/w4def" 2>&1 | tee "$OUT/w4def.log" | grep -v -i warn | head -40
step "done"
