#!/usr/bin/env bash
# Second device call of the twelfth session (~8 min): the first (gpu_run_session12.sh) found the adaptive
# engine at batch 1 locked into plain steps (k=0 on 100% of steps, 0.526 of fixed k=3): a noisy early
# drafting step made plain decoding look faster, and the drafting probe fell on steps where the MTP had
# stopped. MeasuredRates now compares windows of steps with capped outliers and keeps a probe due until
# it is measured. Also what the first call's timeouts cut (no Triton cache then): batch 64 interleaved,
# real-width KKKM decode and 4k prefill dense.
set -uo pipefail
source bench/gpu_env.sh
step "batch 1: adaptive vs fixed k=3, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 \
  2>&1 | grep -E "^median|k per step|measured rates|acceptance per|Error|error|Traceback"
step "batch 64: adaptive vs off, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 64 --k 3 --max-tokens 96 --rounds 6 --baseline off \
  2>&1 | grep -E "^\| [0-9]|^median|k per step|measured rates|Error|error|Traceback"
step "real-width KKKM decode"
timeout 150 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
  --decode-steps 32 --batch 1 32 64 --json "$OUT/model_kkkm.json" 2>&1 | grep -E "^\| (decode|prefill)|Error|error"
step "real-width KKKM prefill 4k, mla_prefill=dense"
timeout 90 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 --repeats 2 \
  --decode-steps 0 --batch --mla-prefill dense --json "$OUT/prefill4k_dense.json" 2>&1 | grep -E "^\| prefill|Error|error"
save_triton_cache
step "done"
