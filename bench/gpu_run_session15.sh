#!/usr/bin/env bash
# Fifteenth session, first call (~3 min): sparse MLA launch configs for prefill (kernels/mla_triton.py
# SparseConfig, new): the decode config (16 heads per program) against more heads per program, wider row steps,
# split output columns and pipeline depths, at 256 / 1,024 / 4,096 queries of one 16k sequence (real widths:
# 64 heads, latent 512, 2,051 selected rows, bf16), each config's output compared with the decode config's.
set -uo pipefail
source bench/gpu_env.sh
step "sparse MLA prefill configs"
timeout 400 python3 bench/mla_sparse_bench.py --prefill 256 1024 4096 --configs \
  h16r64w4c1 h16r32w4c1s2 h32r32w4c1 h32r32w8c1 h32r64w8c1 h32r32w8c1s2 h32r64w4c2 \
  h64r16w8c1 h64r32w8c1 h64r32w4c1 h64r64w8c1 h64r32w8c1s1 h64r32w8c1s2 h64r32w8c2 h64r64w8c2 h64r32w4c2 \
  --json "$OUT/mla_prefill_configs.json" 2>&1 | grep -E "^\||Error|error|Traceback" | head -70
save_triton_cache
step "done"
