#!/usr/bin/env bash
# Thirtieth session, third call: where adaptive k's ~0.4% against fixed k = 7 goes at greedy batch 1 (second call:
# pooled 0.9961, 95% 0.9920-1.0002): (1) the speculator's host calls on this machine's CPU (bench/spec_host_calls.py:
# the stand-in executor, no GPU), fixed k = 7 against adaptive, twice; (2) spec_sides --host-times (new): per side
# the fused step, its device part (execute_spec) and the host walk after it (verify_fused), us a call.
set -uo pipefail
source bench/gpu_env.sh
for i in 1 2; do
  step "host calls on this CPU ($i)"
  timeout 120 python3 bench/spec_host_calls.py --k 7 --passes 40 --only engine._fused_step,speculator._next_k 2>&1 \
    | grep -E "^\||Error|error"
done
step "greedy batch 1: adaptive, k=7, adaptive, k=7, host times"
timeout 450 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,adaptive,7 --batch 1 --max-tokens 96 \
  --rounds 24 --host-times --json "$OUT/s30c_sides_host.json" 2>&1 | tee "$OUT/s30c_sides_host.log" \
  | grep -E "^median|pooled|/ adaptive#1|/ k=7#1:|^\| (side|adap|k=7)|Error|error|Traceback"
step "done"
