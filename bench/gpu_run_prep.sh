#!/usr/bin/env bash
# One device call on nvidia-h200 (~7 min; step limits add up to 590 s): the KDA prep kernels
# (--kda-prep-backend: short conv of decode / verify rows, forget gate, beta) and the fused clamped
# SwiGLU (--act-backend), checked and measured against their torch forms:
# 1. greedy tokens: demo model bf16 (each switch triton vs torch), tiny checkpoints fp32;
# 2. speculative decoding still exact with every default on (MTP k=1 and k=3 vs plain, fp32 and bf16);
# 3. kernels per decode step of the demo model, both switches torch vs both triton;
# 4. real-width KKKM decode batch 1 and 32, both torch vs both triton; the remaining launch sites.
set -uo pipefail
source bench/gpu_env.sh
step "demo model bf16: triton vs torch"
for sw in kda_prep_backend act_backend; do
  timeout 80 python3 bench/backend_demo_tokens.py --switch $sw 2>&1 | grep -E "^\||Error|error"
done
step "speculative decoding exact with the defaults (fp32, bf16; graphs)"
timeout 150 python3 bench/gpu_check_spec.py --max-tokens 64 2>&1 | grep -E "^\||Error|error"
step "demo model: kernels per decode step, prep+act torch / triton"
for b in torch triton; do
  timeout 70 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 60 \
    --set kda_prep_backend=$b --set act_backend=$b --json "$OUT/profile_prep_$b.json" 2>&1 \
    | grep -E "^\| (execute|draft|commit) |^##"
done
step "real-width KKKM decode, prep+act torch / triton"
for b in torch triton; do
  timeout 70 python3 -m tpserve.cli bench model --device cuda --prefill 1024 --repeats 1 --decode-steps 32 \
    --batch 1 32 --kda-prep-backend $b --act-backend $b 2>&1 | grep -E "^\| (prefill|decode)|Error|error" | sed "s/^/$b /"
done
step "tiny checkpoints fp32: triton vs torch"
for sw in kda_prep_backend act_backend; do
  timeout 60 python3 bench/gpu_check_tiny.py --norms --switch $sw --fp32-only --configs default,variant \
    2>&1 | grep -E "^\| (default|variant)|Error|error"
done
step "op sites of one eager decode step (demo, bf16)"
timeout 40 python3 bench/op_sites.py --device cuda --dtype bfloat16 --top 30 2>&1 | grep -E "^\||^ops|Error|error"
save_triton_cache
step "done"
