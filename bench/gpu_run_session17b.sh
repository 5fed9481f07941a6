#!/usr/bin/env bash
# Seventeenth session, second call (~8 min): after the first call (MoE decode nvfp4 at 1 token 367 -> 125 us with
# nvfp4_tile). Its SASS on this workstation showed the decoded tile as the MMA's B operand costs register moves and
# byte permutes, and 32-row tiles on 4 warps decode every tile twice; now the tile is the A operand (W @ X^T) in
# pair order (kernels/qtile.py), FP8 gets the same (fp8_tile: no F2F per value). (1) MoE decode, nvfp4 / fp8 / bf16,
# with the routing and combine kernels the engine uses on CUDA (--moe-route-backend triton), PTX against plain
# Triton bit for bit, the tile as A against B; (2) the W4A16 and W8A16 GEMVs the same way; (3) issue 12: batch 1
# adaptive (k <= 7) against fixed k = 7 on one engine, after the adaptive host time per fused step was cut about
# in half on the CPU (bench/spec_host_calls.py: 9.8 -> 5.2 us over fixed k).
set -uo pipefail
source bench/gpu_env.sh
step "MoE decode (nvfp4 / fp8 / bf16)"
timeout 140 python3 bench/quant_kernels.py --sections moe --out "$OUT/moe" 2>&1 | tee "$OUT/moe.log" \
  | grep -E "^\| (nvfp4|fp8|bf16|grouped)|PTX|WRONG|Error|error|Traceback" | head -30
step "batch 1: adaptive (k<=7) vs fixed k=7, one engine (after the host-time cut)"
timeout 110 python3 bench/spec_ab.py --device cuda --batch 1 --k 7 --max-tokens 96 --rounds 24 --one-engine \
  --json "$OUT/spec_ab_b1_k7_one.json" 2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
step "W4A16 GEMV"
timeout 100 python3 bench/quant_kernels.py --sections w4a16 --out "$OUT/w4" 2>&1 | tee "$OUT/w4.log" \
  | grep -E "^\| [0-9]|PTX|WRONG|Error|error|Traceback" | head -20
step "W8A16 GEMV"
timeout 90 python3 bench/quant_kernels.py --sections w8a16 --out "$OUT/w8" 2>&1 | tee "$OUT/w8.log" \
  | grep -E "^\| [0-9]|PTX|WRONG|Error|error|Traceback" | head -20
save_triton_cache
step "done"
