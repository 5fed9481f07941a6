#!/usr/bin/env bash
# Prepared in the thirteenth session for the next one (~9 min):
# 1. the indexer's top-k: torch.topk, the single top_pools kernel and the chunked pair (parallel chunk sorts + one
#    merge; not yet timed) at 1 / 16 tokens and contexts 1k-128k; if the chunked pair beats torch.topk at every
#    context, --indexer-topk-backend triton can use it and become the default;
# 2. boot with and without a snapshot at real widths with the boot phases printed (where the ~8.8 s outside the
#    restore go);
# 3. batch 64 after Speculator.idle (a step above the verify graphs skips the speculator): adaptive (k<=5) vs off
#    and the plain A/A, three pairs of engines each.
set -uo pipefail
source bench/gpu_env.sh
step "top-k over complete pools: single kernel and chunked pair vs torch.topk"
timeout 90 python3 bench/topk_pools.py --json "$OUT/topk_pools.json" 2>&1 | grep -E "^\||Error|error" | head -14
step "boot with and without a snapshot, real widths, one KDA layer, phases"
timeout 300 python3 bench/boot_snapshot.py --layers K --dir /tmp/tpserve-boot --json "$OUT/boot_snapshot.json" \
  2>&1 | grep -vE "it/s\]|B/s\]" | tail -12
rm -rf /tmp/tpserve-boot
step "batch 64: A/A off vs off, three pairs of engines"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 64 --k 5 --max-tokens 96 --rounds 6 --pairs 3 --baseline off \
  --candidate off --json "$OUT/ab_b64_off_off_pairs3.json" 2>&1 | grep -E "^median|Error|error|Traceback"
step "batch 64: adaptive (k<=5) vs off, three pairs of engines"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 64 --k 5 --max-tokens 96 --rounds 6 --pairs 3 --baseline off \
  --json "$OUT/ab_b64_adaptive5_off_pairs3.json" 2>&1 | grep -E "^median|k per step|Error|error|Traceback"
save_triton_cache
step "done"
