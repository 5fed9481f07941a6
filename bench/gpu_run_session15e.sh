#!/usr/bin/env bash
# Fifteenth session, fifth call (~7 min): the final code (the swept variants removed from the kernel): the prefill
# config against the decode config at 4,096 queries; the demo model's bf16 greedy tokens with --mla-prefill dense
# vs sparse (the fourth call's run was cut by its 90 s limit); real-width KKKM with every default: prefill 4k / 16k,
# decode batch 1 / 32 / 64, and the PNG.
set -uo pipefail
source bench/gpu_env.sh
step "sparse MLA: prefill vs decode config, 4,096 queries"
timeout 120 python3 bench/mla_sparse_bench.py --prefill 4096 --configs h64r64w8s2 \
  --json "$OUT/mla_prefill_final.json" 2>&1 | grep -E "^\||^compiled|Error|error|Traceback" | head -8
step "demo model, bf16: mla_prefill dense vs sparse"
timeout 240 python3 bench/backend_demo_tokens.py --switch mla_prefill --values dense,sparse 2>&1 | grep -E "^\||Error|error|Traceback" | head -4
step "real-width KKKM, every default"
timeout 300 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
  --batch 1 32 64 --decode-steps 48 --json "$OUT/model_kkkm_defaults.json" --plot "$OUT/model_kkkm_defaults.png" 2>&1 \
  | grep -E "^\| |capture|Error|error|Traceback" | head -14
save_triton_cache
step "done"
