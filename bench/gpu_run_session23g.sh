#!/usr/bin/env bash
# Twenty-third session, tenth call (~2 min): kernels/mma_gemv.py's min_blocks (__launch_bounds__' second argument:
# 16-warp blocks held two to an SM) beside the defaults at 8 rows (quant_decode_sweep --sections mma4). In that call
# the defaults too were built with a minimum of 1 block (the option's default then, since 0: not given), which let
# ptxas spend 246 registers on NVFP4's default (164 without): its "default" rows are not the defaults' times.
set -uo pipefail
source bench/gpu_env.sh
step "mma4 sweep"
timeout 300 python3 bench/quant_decode_sweep.py --sections mma4 --out "$OUT" 2>&1 | tee "$OUT/s23g_mma4.log" \
  | grep -v "^  .*WRONG" | tail -50
grep -c WRONG "$OUT/s23g_mma4.log"
step "done"
