#!/usr/bin/env bash
# Twenty-sixth session, first call: programmatic dependent launch between our Triton GEMVs
# (kernels/gemv_triton.py `pdl`): a chain of the KKKM model's dense shapes in one CUDA graph, plain against PDL.
set -uo pipefail
source bench/gpu_env.sh
for rows in 1 8; do
  step "pdl_chain M=$rows"
  timeout 240 python3 bench/pdl_chain.py --rows $rows --repeats 8 --rounds 3 --json "$OUT/s26_pdl_chain_m$rows.json" 2>&1 | tail -12
done
save_triton_cache
step "done"
