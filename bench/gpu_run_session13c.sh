#!/usr/bin/env bash
# Thirteenth session, third call (~7 min):
# 1. real-width KKKM decode at batch 1, profiled: the device's busy time per step against the step time (how
#    long the GPU waits for the host between steps), every kernel in the JSON;
# 2. boot from a snapshot with the parallel reader (model/st_reader.py; the first call measured 0.63 GB/s
#    through safetensors' load_file), with the disk's ceiling read the same way into host memory;
# 3. batch 1, adaptive (k<=7) vs fixed k=7 and the A/A control (fixed k=7 vs fixed k=7), 16 rounds each.
set -uo pipefail
source bench/gpu_env.sh
step "real-width KKKM decode batch 1, profiled"
timeout 200 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
  --decode-steps 32 --batch 1 --profile 16 --json "$OUT/model_kkkm_profile.json" 2>&1 | grep -E "^\||busy|Error|error" | head -30
step "boot with and without a snapshot, real widths, one KDA layer (parallel reader)"
timeout 300 python3 bench/boot_snapshot.py --layers K --dir /tmp/tpserve-boot --json "$OUT/boot_snapshot.json" \
  2>&1 | grep -vE "it/s\]|B/s\]" | tail -12
rm -rf /tmp/tpserve-boot
step "A/A: fixed k=7 vs fixed k=7, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 7 --fixed-k 7 --max-tokens 96 --rounds 16 \
  --candidate fixed --json "$OUT/ab_fixed7_fixed7.json" 2>&1 | grep -E "^median|Error|error|Traceback"
step "batch 1: adaptive (k<=7) vs fixed k=7, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 7 --max-tokens 96 --rounds 16 \
  --json "$OUT/ab_adaptive7_fixed7_16.json" 2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
save_triton_cache
step "done"
