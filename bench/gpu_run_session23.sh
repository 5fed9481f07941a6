#!/usr/bin/env bash
# Twenty-third session, first and second calls (~1 min each): the W8A16 / W4A16 GEMVs in CUDA (kernels/mma_gemv.py,
# compiled by NVRTC through torch.cuda._compile_kernel): every config against fp32 math on odd shapes, every e4m3
# code, graph replay == eager, then 1-8 rows on 12288 x 4096 and 4096 x 12288 timed beside the Triton default
# (bench/quant_decode_sweep.py --sections mma). The first call ran a first FP8-only version of the kernel.
set -uo pipefail
source bench/gpu_env.sh
step "NVRTC"
python3 -c "import torch; print(torch.__version__, torch.version.cuda, hasattr(torch.cuda, '_compile_kernel'))"
step "mma sweep"
timeout 560 python3 bench/quant_decode_sweep.py --sections mma --out "$OUT" 2>&1 | tee "$OUT/s23_mma.log" \
  | grep -v "^  .*WRONG" | tail -80
grep -c WRONG "$OUT/s23_mma.log"
step "done"
