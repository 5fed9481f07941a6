#!/usr/bin/env bash
# Third device call of the twelfth session (~3 min): gpu_run_session12b.sh showed the adaptive engine's
# measured plain rate at batch 1 as 12,795 tok/s (a step's time stopped when `execute` returned, before
# the GPU ran it); step times now end with the tokens on the host. Batch 1 adaptive vs fixed k=3 and
# batch 64 adaptive vs plain, interleaved.
set -uo pipefail
source bench/gpu_env.sh
step "batch 1: adaptive vs fixed k=3, interleaved"
timeout 200 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 8 \
  2>&1 | grep -E "^\| [0-9]|^median|k per step|measured rates|acceptance per|Error|error|Traceback"
step "batch 64: adaptive vs off, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 64 --k 3 --max-tokens 96 --rounds 6 --baseline off \
  2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
step "done"
