#!/usr/bin/env bash
# Nineteenth session, third call (~3 min): the W4A16 one-row grid and occupancy sweep (quant_decode_sweep.py
# --sections w4one: every config's time printed), after Nsight Compute (second call, bench/results/s19b_ncu_*.txt)
# found the NVFP4 GEMVs at 1.6-2.7 active warps per scheduler (grids of 192-384 programs, 0.73 waves) against the
# FP8 one-row kernel's 9.4. The one-row kernel decodes to float16 (HADD2.F32 widens it on the FMA pipe) or bf16.
set -uo pipefail
source bench/gpu_env.sh
step "W4A16 one row, every config"
timeout 400 python3 bench/quant_decode_sweep.py --sections w4one --out "$OUT/w4one" 2>&1 | tee "$OUT/w4one.log" \
  | grep -v -i warn | head -150
step "done"
