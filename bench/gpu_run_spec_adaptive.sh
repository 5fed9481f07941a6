#!/usr/bin/env bash
# One short device call on nvidia-h200 (< 300 s): `tpserve bench spec` at batch 1 and 64 after the
# adaptive mode stopped drafting above the verify graphs' largest batch; the KDA path the engine
# chose (fla-core self-test by head size); the W8A16 table again (cuBLAS column measured right).
set -uo pipefail
source bench/gpu_env.sh
step "bench spec (bf16, graphs)"
timeout 130 python3 -m tpserve.cli bench spec --device cuda --batch 1 64 --k 3 --max-tokens 96 \
  --json "$OUT/spec.json" --plot "$OUT/spec.png" 2>&1 | tee "$OUT/spec_bench.log" | grep -E "^\||KDA path|plot|Error|error"
step "fla-core KDA self-test by head size"
timeout 80 python3 bench/gpu_check_fla.py 2>&1 | tee "$OUT/fla_check.log" | grep -E "^\||Error"
step "W8A16 GEMV vs tiled vs cuBLAS bf16"
timeout 50 python3 bench/quant_kernels.py --sections w8a16 --out "$OUT" 2>&1 | tee "$OUT/quant.log" | grep -E "^\||\[|Error"
step "done"
