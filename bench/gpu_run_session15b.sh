#!/usr/bin/env bash
# Fifteenth session, second call (~5 min): more sparse MLA launch configs around the first call's best (64 heads,
# 64 rows, 8 warps): pipeline depths, 128-row steps, 16 warps; 32 to 256 queries for the decode/prefill switch
# point; then real-width KKKM prefill 4k / 16k with the prefill config as the default (kernels/mla_triton.py
# PREFILL, one kernel call per 4,096 queries) and its 16k kernel profile.
set -uo pipefail
source bench/gpu_env.sh
step "sparse MLA configs, 4,096 queries"
timeout 300 python3 bench/mla_sparse_bench.py --prefill 4096 --configs \
  h64r64w8c1 h64r64w8c1s1 h64r64w8c1s2 h64r64w8c1s4 h64r64w16c1 h64r128w8c1s1 h64r128w16c1s1 h64r128w8c1s2 \
  h64r32w16c1 h32r64w4c1 h32r64w4c1s2 h32r128w4c1s1 h64r64w4c1 \
  --json "$OUT/mla_prefill_configs_4096.json" 2>&1 | grep -E "^\||Error|error|Traceback" | head -30
step "sparse MLA decode vs prefill config, few queries"
timeout 200 python3 bench/mla_sparse_bench.py --prefill 32 64 128 256 --configs h64r64w8c1 h32r32w4c1 \
  --json "$OUT/mla_prefill_configs_small.json" 2>&1 | grep -E "^\||Error|error|Traceback" | head -20
step "real-width KKKM prefill, defaults, profile 16k"
timeout 200 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
  --batch 1 --decode-steps 16 --profile-prefill 16384 --json "$OUT/model_kkkm_prefill.json" 2>&1 \
  | grep -E "^\| |^device busy|Error|error|Traceback" | head -34
save_triton_cache
step "done"
