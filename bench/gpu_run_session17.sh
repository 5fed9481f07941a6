#!/usr/bin/env bash
# Seventeenth session, first call (~9 min): issue 11's decode kernels with nvfp4_tile (kernels/nvfp4_tile.py:
# two e2m1 codes per 32-bit operation, bf16 tiles on the tensor cores), every timed call on its own weight
# copy or routing (no L2 reuse). (1) grouped MoE decode at 1 / 8 tokens, nvfp4 / fp8 / bf16, best of a tile
# sweep, with the PTX decode compared bit for bit against plain Triton; (2) the W4A16 GEMV, float32-bits decode
# vs nvfp4_tile, K split or not; (3) the W8A16 GEMV, K split (atomics + zero fill + cast) or not.
set -uo pipefail
source bench/gpu_env.sh
step "MoE decode (nvfp4 / fp8 / bf16)"
timeout 200 python3 bench/quant_kernels.py --sections moe --out "$OUT/moe" 2>&1 | tee "$OUT/moe.log" \
  | grep -E "^\| (nvfp4|fp8|bf16|grouped)|PTX|WRONG|Error|error|Traceback" | head -30
step "W4A16 GEMV"
timeout 190 python3 bench/quant_kernels.py --sections w4a16 --out "$OUT/w4" 2>&1 | tee "$OUT/w4.log" \
  | grep -E "^\| [0-9]|PTX|WRONG|Error|error|Traceback" | head -20
step "W8A16 GEMV"
timeout 150 python3 bench/quant_kernels.py --sections w8a16 --out "$OUT/w8" 2>&1 | tee "$OUT/w8.log" \
  | grep -E "^\| [0-9]|WRONG|Error|error|Traceback" | head -20
save_triton_cache
step "done"
