#!/usr/bin/env bash
# Twentieth session, second call (~5 min): (1) W8A16 at 8 rows, qtile B with its K split over 0-8 waves: each kernel's
# device time, the GEMV alone against the zero fill and cast a split adds (is an in-kernel reduction worth building?);
# (2) the nineteenth session's unexplained 536 ms eager decode steps: real-width KKKM bf16 with --enforce-eager,
# 8 decode steps at batch 1 after prompts of 256 and 4096 tokens, every step's time printed.
set -uo pipefail
source bench/gpu_env.sh
step "W8A16 at 8 rows: K splits, kernel by kernel"
timeout 200 python3 bench/quant_decode_sweep.py --sections w8split --out "$OUT/w8split" 2>&1 | tee "$OUT/w8split.log" | grep -v -i warn | head -30
step "KKKM bf16 eager decode, every step"
timeout 300 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 256 4096 --repeats 1 --batch 1 \
  --decode-steps 8 --enforce-eager --json "$OUT/kkkm_eager.json" 2>&1 | tee "$OUT/kkkm_eager.log" \
  | grep -E "^\| |Error|Traceback" | head -20
python3 -c "
import json; d = json.load(open('$OUT/kkkm_eager.json'))
for label, r in d['runs'].items():
    for b, v in r['decode'].items():
        print(label, 'batch', b, 'step ms:', ' '.join(f'{x:.1f}' for x in v['all_ms']))
" 2>&1 | head -20
step "done"
