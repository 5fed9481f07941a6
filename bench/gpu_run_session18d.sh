#!/usr/bin/env bash
# Eighteenth session, fourth call (~2 min): the W8A16 GEMV defaults after the third call (one row: 2048-wide K tiles,
# one split, where K >= 8192; 2-16 rows: qtile as B, 4 stages, split over 2 waves), timed beside the sweep; then 8
# real-width FP8 layers (every linear FP8) decode 1 / 8 / 32 with them.
set -uo pipefail
source bench/gpu_env.sh
step "W8A16 GEMV, the new defaults"
timeout 100 python3 bench/quant_decode_sweep.py --sections w8a16 2>&1 | tee "$OUT/w8.log" | grep -B1 -A6 "M=" | head -60
step "real widths, 8 layers, fp8"
timeout 150 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first --quantization fp8 \
  --prefill 4096 --repeats 1 --decode-steps 16 --batch 1 8 32 --json "$OUT/model_fp8_8layers.json" 2>&1 \
  | tee "$OUT/bench_model_fp8.log" | grep -E "^\| (prefill|decode)|Error|error|Traceback" | head -20
step "done"
