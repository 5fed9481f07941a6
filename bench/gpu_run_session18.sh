#!/usr/bin/env bash
# Eighteenth session, first call (~9 min). Why the quantized decode kernels sit at 35-58% of their byte floors:
# (1) the FP8 GEMV's qtile at M = 8 gave PTX != plain Triton last session: is it the split-K fp32 atomics (order
# of the adds) or the decode? (2) MoE decode (grouped NVFP4 / FP8 experts) over Triton's pipeline depth, and a
# per-kernel profile (routing, gate / up, down, combine) of the best config; (3) the W8A16 / W4A16 GEMVs over
# pipeline depth, and at one FP8 row the new _fp8_row_kernel (K tiles over several scale blocks, prefetch of the
# next tile: its loads feed no dot, so Triton does not pipeline them); (4) the bf16 MoE prefill with the Triton
# combine and SwiGLU (issue 11's 60% MFU goal). bench/quant_decode_sweep.py says more.
set -uo pipefail
source bench/gpu_env.sh
step "FP8 GEMV PTX vs plain; MoE decode over pipeline stages, per-kernel profile"
timeout 230 python3 bench/quant_decode_sweep.py --sections fp8det,moe --out "$OUT/a" 2>&1 | tee "$OUT/a.log" \
  | grep -v "^\s*$" | head -90
step "MoE prefill bf16: as timed before, as the engine runs it (Triton combine and SwiGLU), grouped_mm alone"
timeout 70 python3 bench/quant_decode_sweep.py --sections prefill --out "$OUT/p" 2>&1 | tee "$OUT/p.log" | head -30
step "GEMV sweep (W8A16, W4A16)"
timeout 230 python3 bench/quant_decode_sweep.py --sections gemv --out "$OUT/b" 2>&1 | tee "$OUT/b.log" | head -120
save_triton_cache
step "done"
