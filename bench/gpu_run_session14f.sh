#!/usr/bin/env bash
# Fourteenth session, sixth call (~9 min, the session's last device minutes):
# 1. real-width KKKM with every default of this session (async scheduling, merged linears, Triton GEMV, chunked
#    top-k, conv_chunk, combine_sorted, --mla-prefill auto): prefill 4k / 16k, decode batch 1 / 32 / 64, the PNG;
# 2. batch 64 with speculation after async scheduling (an idle speculator's steps run async too): adaptive (k<=5)
#    vs off and the plain A/A, two pairs of engines each;
# 3. boot with and without a snapshot at real widths with the boot phases printed.
set -uo pipefail
source bench/gpu_env.sh
step "real-width KKKM, defaults"
timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
  --decode-steps 48 --batch 1 32 64 --plot "$OUT/model_kkkm_defaults.png" --json "$OUT/model_kkkm_defaults.json" \
  2>&1 | grep -E "^\| (decode|prefill)|Error|error|Traceback" | head -8
step "batch 64: adaptive (k<=5) vs off, two pairs of engines"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 64 --k 5 --max-tokens 96 --rounds 6 --pairs 2 --baseline off \
  --json "$OUT/ab_b64_adaptive5_off_pairs2.json" 2>&1 | grep -E "^median|k per step|pair|Error|error|Traceback"
step "batch 64: A/A off vs off, two pairs of engines"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 64 --k 5 --max-tokens 96 --rounds 6 --pairs 2 --baseline off \
  --candidate off --json "$OUT/ab_b64_off_off_pairs2.json" 2>&1 | grep -E "^median|pair|Error|error|Traceback"
step "boot with and without a snapshot, real widths, one KDA layer, phases"
timeout 140 python3 bench/boot_snapshot.py --layers K --dir /tmp/tpserve-boot --json "$OUT/boot_snapshot.json" \
  2>&1 | grep -vE "it/s\]|B/s\]" | tail -14
rm -rf /tmp/tpserve-boot
step "done"
