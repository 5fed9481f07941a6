#!/usr/bin/env bash
# Fifteenth session, third call (~6 min): real-width KKKM prefill 4k / 16k with the sparse MLA prefill config
# (kernels/mla_triton.py PREFILL: 64 heads, 64 rows, 8 warps, 2 stages; one kernel call per 4,096 queries) and
# its 16k kernel profile (the second call's run was cut by its 200 s limit while compiling); the prefill config
# with the cache rows looked up first; the decode kernel's table (unchanged config, new signature).
set -uo pipefail
source bench/gpu_env.sh
step "real-width KKKM prefill, defaults, profile 16k"
timeout 420 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
  --batch 1 --decode-steps 16 --profile-prefill 16384 --json "$OUT/model_kkkm_prefill.json" 2>&1 \
  | grep -E "^\| |^device busy|Error|error|Traceback" | head -34
save_triton_cache
step "sparse MLA: rows looked up first"
timeout 120 python3 bench/mla_sparse_bench.py --prefill 4096 --rows --configs h64r64w8c1s2 h64r64w8c1 \
  --json "$OUT/mla_prefill_rows.json" 2>&1 | grep -E "^\||Error|error|Traceback" | head -12
step "sparse MLA decode table"
timeout 120 python3 bench/mla_sparse_bench.py --json "$OUT/mla_decode.json" 2>&1 | grep -E "^\||Error|error|Traceback" | head -8
save_triton_cache
step "done"
