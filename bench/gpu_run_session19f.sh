#!/usr/bin/env bash
# Nineteenth session, sixth call (~4 min): the one-row kernels on both shapes, every config printed
# (quant_decode_sweep.py --sections rows): NVFP4 after its loop changed (the decoded codes joined in k order
# against one x tile per K step: 5.5 instead of 6.7 SASS instructions a weight at 32 x 512), and FP8 with wider K
# tiles and fewer rows per program (4096 x 12288 was at 75% of its floor); then the W4A16 default again (w4def).
set -uo pipefail
source bench/gpu_env.sh
step "one-row kernels, every config"
timeout 330 python3 bench/quant_decode_sweep.py --sections rows --out "$OUT/rows" 2>&1 | tee "$OUT/rows.log" | grep -v -i warn | head -280
step "W4A16 one row: the default"
timeout 100 python3 bench/quant_decode_sweep.py --sections w4def --out "$OUT/w4def" 2>&1 | tee "$OUT/w4def.log" | grep -v -i warn | head -30
step "done"
