#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (GPU 0 alone for TP=1): the CUDA checks and timings of the
# core, serving and tensor-parallel issues. Needs the wheels in .whl (bench/gpu_env.sh lists them).
# Writes logs under $OUT. Usage (from the repo root): bash bench/gpu_run_core.sh
set -uo pipefail
source bench/gpu_env.sh
AR=${AR:---no-custom-allreduce}
STEPS=${STEPS:-tiny serve tp1 tp2 hf}   # run a subset with e.g. STEPS="tiny serve"
want() { [[ " $STEPS " == *" $1 "* ]]; }
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m | head -4
python3 -c 'import torch, triton, fla; print("torch", torch.__version__, "triton", triton.__version__, "fla", fla.__version__)'
if want tiny; then
step "tiny checkpoints: CUDA fp32 vs CPU, TP=2 NCCL"
timeout 240 python3 bench/gpu_check_tiny.py --tp --custom-allreduce 2>&1 | tee "$OUT/tiny.log" | grep "^|"
fi
if want serve; then
step "serve the tiny model on CUDA and ask a chat"
python3 -m tpserve.cli serve --device cuda --port 18123 --log-level warning > "$OUT/serve.log" 2>&1 &
SERVER=$!
for i in $(seq 60); do curl -sf localhost:18123/health >/dev/null && break; sleep 1; done
curl -s localhost:18123/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"tiny-glm5-next","messages":[{"role":"user","content":"Hello from an H200"}],"max_tokens":16}' | tee "$OUT/chat.json"; echo
kill -TERM $SERVER; wait $SERVER; echo "server exit code $?"
fi
if want tp1; then
step "real-width KKKM, TP=1"
timeout 240 python3 -m tpserve.cli bench model --device cuda --prefill 4096 16384 --decode-steps 32 --batch 1 8 32 \
  --json "$OUT/model_tp1.json" 2>&1 | tail -8
fi
if want tp2; then
step "real-width KKKM, TP=2 ($AR)"
timeout 240 python3 -m tpserve.cli bench model --device cuda --tp 2 $AR --prefill 4096 16384 --decode-steps 32 \
  --batch 1 8 32 --json "$OUT/model_tp2.json" 2>&1 | tail -8
fi
if want hf; then
step "transformers 5.23.0 baseline, same layers"
timeout 200 python3 bench/hf_baseline.py --prefill 1024 4096 --decode-steps 16 2>&1 | tail -6
fi
step "done"
