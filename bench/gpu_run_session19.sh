#!/usr/bin/env bash
# Nineteenth session, first call (~6 min): (1) the NVFP4 GEMV at one row: the new one-row kernel
# (kernels/quant_gemv._nvfp4_row_kernel: qtile.nvfp4_codes, FMAs, no dot: no shared-memory staging, barrier or MMA
# wait in its loop) against the qtile configs, which now also run with one pipeline stage (no shared-memory ring for
# W, so more programs per SM) and 8-warp programs; (2) W8A16 at M = 8 with one stage and 8 warps beside the
# eighteenth session's configs. Every config is checked against fp32 math before it is timed.
set -uo pipefail
source bench/gpu_env.sh
step "tools"; command -v ncu nsys || echo "no ncu / nsys on PATH"; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
step "W4A16 GEMV sweep (one-row kernel, one-stage qtile)"
timeout 280 python3 bench/quant_decode_sweep.py --sections w4a16 --out "$OUT/w4" 2>&1 | tee "$OUT/w4.log" | grep -v -i warn | head -60
step "W8A16 GEMV sweep (M = 8: one stage, 8 warps)"
timeout 250 python3 bench/quant_decode_sweep.py --sections w8a16 --out "$OUT/w8" 2>&1 | tee "$OUT/w8.log" | grep -v -i warn | head -60
step "done"
