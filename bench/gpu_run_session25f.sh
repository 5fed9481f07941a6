#!/usr/bin/env bash
# Twenty-fifth session, sixth call: quant_decode_sweep --sections mmasmem again with 16-warp blocks (smem, and two
# regs configs): the fifth call's Nsight Compute found FP8 4096 x 12288's grid of 256 8-warp blocks holding ~15 warps
# an SM (achieved occupancy 24%, 37-62% possible), too few warps to hide the loads.
set -uo pipefail
source bench/gpu_env.sh
step "mmasmem"
timeout 450 python3 bench/quant_decode_sweep.py --sections mmasmem --out "$OUT" 2>&1 | tee "$OUT/s25f_mmasmem.log" \
  | grep -v "^  .*WRONG\|Error" | tail -120
step "done"
