#!/usr/bin/env bash
# One device call (~5 min): the drafter's argmax-and-probability in one Triton kernel (`--argmax-backend`),
# written straight into the spec graph's output, and the chain's later-depth positions / cache rows computed
# once; plus what gpu_run_commit.sh's first run did not show (the fla commit tests' summary line).
# 1. tests/kernels/test_kda_fla.py on the GPU;
# 2. the argmax kernel against torch on the GPU (demo vocab 4,096 and GLM-5.3-Flash's 154,880), and its time;
# 3. kernels per fused step (556 before) and plain step (257);
# 4. bench spec batch 1 (k=3 1.71x, adaptive 1.65x before), argmax triton then torch;
# 5. adaptive vs fixed k=3 interleaved (0.976 before).
set -uo pipefail
source bench/gpu_env.sh
step "fla verify / commit tests on the GPU"
PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests timeout 120 python3 -m pytest -p no:cacheprovider -W ignore \
  tests/kernels/test_kda_fla.py 2>&1 | grep -E "passed|failed|error"
step "argmax kernel vs torch on the GPU"
timeout 60 python3 - <<'PY'
import torch
from tpserve.engine.sampler import argmax_and_probability
from tpserve.kernels.argmax_triton import argmax_and_probability_triton
for n, v in ((1, 4096), (16, 4096), (1, 154880), (16, 154880)):
    x = 4 * torch.randn(n, v, device="cuda")
    got, want = argmax_and_probability_triton(x), argmax_and_probability(x)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    for f in (argmax_and_probability_triton, argmax_and_probability):
        for _ in range(20): f(x)
    ev[0].record(); [argmax_and_probability_triton(x) for _ in range(200)]; ev[1].record()
    ev[2].record(); [argmax_and_probability(x) for _ in range(200)]; ev[3].record(); torch.cuda.synchronize()
    print(f"| {n}x{v} | argmax equal {torch.equal(got[0], want[0])} | max rel prob diff "
          f"{((got[1] - want[1]).abs() / want[1]).max().item():.1e} | triton {ev[0].elapsed_time(ev[1]) * 5:.1f} us "
          f"| torch {ev[2].elapsed_time(ev[3]) * 5:.1f} us (eager, per call) |")
PY
step "kernels per phase, batch 1, k=3 fused"
timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 40 \
  --json "$OUT/profile_argmax.json" 2>&1 | grep -E "^\| (execute|draft|commit|execute_spec) |^##"
for b in triton torch; do
  step "bench spec batch 1, --argmax-backend $b"
  timeout 110 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 --argmax-backend $b \
    --json "$OUT/spec_b1_argmax_$b.json" 2>&1 | grep -E "^\| 1 |Error|error|Traceback"
done
step "adaptive vs fixed k=3, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 \
  2>&1 | grep -E "^median|^adaptive k|Error|error|Traceback"
save_triton_cache
step "done"
