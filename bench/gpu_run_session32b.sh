#!/usr/bin/env bash
# Thirty-second session, second call: the grouped Triton expert kernels after their shared epilogues moved to
# kernels/moe_tiles_triton.py (ace6f60), on the GPU: bf16 experts_triton against the torch loop and fp32 math
# (bench/gpu_check_kernels.py), and the NVFP4 grouped kernels through the engine's dispatch (test_nvfp4_m1's GPU
# tests: quant_ops.experts_nvfp4 under the triton backend against fp32 math).
set -uo pipefail
source bench/gpu_env.sh
step "gpu_check_kernels: bf16 grouped experts"
timeout 240 python3 bench/gpu_check_kernels.py --tokens 1,8,32,256 --inter 2048 --reference --skip-mhc 2>&1 | tail -12
step "GPU tests: test_nvfp4_m1"
timeout 200 python3 -m pytest -p no:cacheprovider -q -rs tests/kernels/test_nvfp4_m1.py -k gpu 2>&1 | tail -4
step "done"
