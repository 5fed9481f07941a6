#!/usr/bin/env bash
# One device call on nvidia-h200 (< 600 s): speculative decoding on the GPU and the CPU-tolerance
# tests on this machine's CPU (another CPU model than CI's).
#  1. lscpu, then the oracle / TP / prompt-logprob tests on the CPU (fla-core left out of the path:
#     with Triton present transformers would route its reference model through fla's GPU kernels);
#  2. greedy tokens with MTP drafts vs plain decoding on the GPU, float32 and bf16 (gpu_check_spec.py);
#  3. `tpserve bench spec` on the GPU (bf16, decode graphs on for plain steps): tok/s, accepted length.
# Needs the wheels in .whl (bench/gpu_env.sh lists them; pytest, pluggy, iniconfig too).
set -uo pipefail
source bench/gpu_env.sh
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
lscpu | grep -E "^Model name|^Socket|^Thread|^Core"
step "CPU tolerance tests on this CPU"
mkdir -p /tmp/site_nofla
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_nofla $(ls .whl/*.whl | grep -v fla_core) || exit 1
PYTHONPATH=/tmp/site_nofla:$PWD/src:$PWD/tests CUDA_VISIBLE_DEVICES= timeout ${CPU_TESTS_S:-150} python3 -m pytest \
  -p no:cacheprovider -x -k "transformers or blocking" tests/model/test_oracle.py tests/dist/test_tp.py \
  tests/engine/test_prompt_logprobs.py tests/model/test_quant_oracle.py 2>&1 | tee "$OUT/cpu_tests.log" | tail -15
step "speculative decoding: greedy tokens vs plain on the GPU"
timeout 130 python3 bench/gpu_check_spec.py --device cuda 2>&1 | tee "$OUT/spec_check.log" | grep "^|"
step "bench spec (bf16)"
timeout 280 python3 -m tpserve.cli bench spec --device cuda --batch 1 64 --k 1 3 5 --max-tokens 96 \
  --json "$OUT/spec.json" --plot "$OUT/spec.png" 2>&1 | tee "$OUT/spec_bench.log" | grep -E "^\||plot"
step "done"
