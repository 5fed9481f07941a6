#!/usr/bin/env bash
# One device call on nvidia-h200 (< 480 s), after the merges of 2026-12-01: graphs vs eager on the
# tiny rows run 11 did not reach (variant bf16, notail), then sparse vs dense MLA prefill on
# real-width KKKM layers (A/B in one process) and a per-kernel profile of a batch-1 decode step.
set -uo pipefail
source bench/gpu_env.sh
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step "tiny checkpoints: graphs vs eager (variant, notail)"
timeout 150 python3 bench/gpu_check_tiny.py --graphs --configs variant,notail 2>&1 | tee "$OUT/tiny_graphs.log" | grep "^|"
step "real-width KKKM: sparse vs dense MLA prefill, decode profile"
timeout 240 python3 bench/gpu_prefill_ab.py --json "$OUT/prefill_ab.json" 2>&1 | tee "$OUT/prefill_ab.log" \
  | grep -vE "Loading|^\s*$" | tail -45
step "done"
