#!/usr/bin/env bash
# Twenty-first session, first and second calls (~2 min each): W4A16 through the new nibble-planes kernel
# (kernels/quant_gemv._nvfp4_planes_kernel: the four nibble planes decoded elementwise in the tensor cores' register
# operand; offline sm_90 SASS 4.0-4.2 instructions a weight against the one-row kernel's 6.0): a sweep at
# 12288 x 4096 one row (the first call: wgmma configs; the second adds mma.sync ones, fewer warps than a warpgroup),
# the best five at 8 and 16 rows and on 4096 x 12288, each beside the default, and PTX == plain Triton.
set -uo pipefail
source bench/gpu_env.sh
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
step "W4A16 nibble planes"
timeout 480 python3 bench/quant_decode_sweep.py --sections w4planes --out "$OUT/w4planes" 2>&1 \
  | tee "$OUT/w4planes.log" | grep -v -i warn | head -120
step "done"
