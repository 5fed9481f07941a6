#!/usr/bin/env bash
# One device call on nvidia-h200 (~8 min; step limits add up to 560 s): the fused MoE routing
# (--moe-route-backend: router top-k and the experts' sorted layout, one Triton kernel each) and the
# mHC projection weight kept in fp32, measured and checked:
# 1. the router GEMV with fp32 output from bf16 inputs (torch.mm out_dtype) against F.linear in fp32;
# 2. greedy tokens of the demo model (bf16), route triton vs torch; the tiny checkpoints in fp32;
# 3. kernels per decode step of the demo model, route torch vs triton (decode_profile);
# 4. where the remaining launches come from (op_sites: eager, per source line);
# 5. real-width KKKM decode batch 1 and 32, route torch vs triton.
set -uo pipefail
source bench/gpu_env.sh
step "router GEMV: torch.mm out_dtype=float32 vs F.linear fp32"
timeout 60 python3 - <<'PY' 2>&1 | tail -3
import torch, torch.nn.functional as F
from tpserve.model.moe import router_logits
for t in (1, 32, 4096):
    x = torch.randn(t, 4096, device="cuda").bfloat16(); w = (torch.randn(288, 4096, device="cuda") / 64).bfloat16()
    ref = F.linear(x.float(), w.float()); got = router_logits(x, w)
    print(f"| T={t} | {got.dtype} | max abs diff {float((got - ref).abs().max()):.2e} | max abs {float(ref.abs().max()):.2e} |")
PY
step "demo model bf16: moe route triton vs torch"
timeout 100 python3 bench/backend_demo_tokens.py --switch moe_route_backend 2>&1 | grep -E "^\||Error|error"
step "demo model: kernels per decode step, route torch / triton"
for b in torch triton; do
  timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 60 \
    --moe-route-backend $b --json "$OUT/profile_route_$b.json" 2>&1 | grep -E "^\| (execute|draft|commit) |^##"
done
step "op sites of one eager decode step (demo, bf16)"
timeout 60 python3 bench/op_sites.py --device cuda --dtype bfloat16 --top 45 2>&1 | grep -E "^\||^ops|Error|error"
step "real-width KKKM decode, route torch / triton"
for b in torch triton; do
  timeout 75 python3 -m tpserve.cli bench model --device cuda --prefill 1024 --repeats 1 --decode-steps 32 \
    --batch 1 32 --moe-route-backend $b 2>&1 | grep -E "^\| (prefill|decode)|Error|error" | sed "s/^/$b /"
done
step "tiny checkpoints fp32: route triton vs torch"
timeout 100 python3 bench/gpu_check_tiny.py --norms --switch moe_route_backend --fp32-only --configs default,variant \
  2>&1 | grep -E "^\||Error|error"
save_triton_cache
step "done"
