#!/usr/bin/env bash
# Thirtieth session, fourth call: issue 12 after a fused step's MeasuredRates observation moved into the next step's
# launch window (Speculator.while_waiting, run by ModelRunner.execute_spec between the graphs' launch and the host
# copy): greedy batch 1, adaptive and fixed k = 7 twice each on one engine, 48 rounds, with --host-times.
set -uo pipefail
source bench/gpu_env.sh
step "greedy batch 1: adaptive, k=7, adaptive, k=7, host times"
timeout 540 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,adaptive,7 --batch 1 --max-tokens 96 \
  --rounds 48 --host-times --json "$OUT/s30d_sides_host.json" 2>&1 | tee "$OUT/s30d_sides_host.log" \
  | grep -E "^median|pooled|/ adaptive#1|/ k=7#1:|best fixed|^\| (side|adap|k=7)|k per step|Error|error|Traceback"
step "done"
