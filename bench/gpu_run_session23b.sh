#!/usr/bin/env bash
# Twenty-third session, third call (~2 min): kernels/mma_gemv.py at 8 rows around the second call's best
# (interleaved K chunks): 4-16 warps a block, one to four row tiles a warp, both formats (that call also ran the
# largest-L1 carveout, since removed)
# (bench/quant_decode_sweep.py --sections mma2).
set -uo pipefail
source bench/gpu_env.sh
step "mma2 sweep"
timeout 500 python3 bench/quant_decode_sweep.py --sections mma2 --out "$OUT" 2>&1 | tee "$OUT/s23b_mma2.log" \
  | grep -v "^  .*WRONG" | tail -70
grep -c WRONG "$OUT/s23b_mma2.log"
step "done"
